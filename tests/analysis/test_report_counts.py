"""Reports name counts in the right number: a one-step window reads '1 step', not '1 steps'."""

from __future__ import annotations

import dataclasses

from stallscope.analysis.analyze import analyze_run
from stallscope.report.html import render_html
from stallscope.report.markdown import render_markdown
from stallscope.report.text import render_text


def test_a_one_step_window_reads_one_step(healthy_profile):
    analysis = analyze_run(healthy_profile, with_xprof=False)
    steps = analysis.steps
    first_counted = next(i for i, s in enumerate(steps.steps) if s.counted)
    one = tuple(dataclasses.replace(s, counted=i == first_counted) for i, s in enumerate(steps.steps))
    analysis = dataclasses.replace(analysis, steps=dataclasses.replace(steps, steps=one))
    assert analysis.steps.counted_steps == 1
    for render in (render_text, render_markdown, render_html):
        report = render(analysis)
        assert "1 step" in report, render.__name__
        assert "1 steps" not in report, render.__name__
