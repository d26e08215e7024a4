"""Our input share agrees with TensorBoard's Input Pipeline Analyzer (xprof) on the same profile."""

from __future__ import annotations

import pytest

from stallscope.analysis.analyze import analyze_run

pytest.importorskip("xprof")

TOLERANCE = 0.02  # 2 percentage points


@pytest.mark.parametrize("fixture", ["stalled_profile", "healthy_profile"])
def test_input_share_agrees_with_xprof(fixture, request):
    analysis = analyze_run(request.getfixturevalue(fixture))
    assert analysis.xprof is not None and analysis.xprof.error == ""
    assert analysis.xprof.steps == analysis.steps.counted_steps
    assert analysis.xprof.input_share == pytest.approx(analysis.input_share, abs=TOLERANCE)
    expected = "HIGHLY input-bound" if fixture == "stalled_profile" else "input-bound"
    assert expected in analysis.xprof.conclusion
