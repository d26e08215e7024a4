"""Step breakdown from step markers: stalled vs healthy, spreads, the run's own steps.csv."""

from __future__ import annotations

import pytest

from stallscope.analysis.steps import Spread, run_timing, step_breakdown
from stallscope.analysis.xplane import load_profile
from stallscope.workload.rundir import read_steps


def test_stalled_loop_waits_for_input_most_of_each_step(stalled_profile):
    steps = step_breakdown(load_profile(stalled_profile))
    assert steps.counted_steps == len(steps.steps) - 2  # first and last left out, as xprof
    assert not steps.steps[0].counted and not steps.steps[-1].counted
    assert steps.verdict == "highly"
    assert steps.input_share > 0.4
    # input wait is the sequential map of 4 elements; compute is the 8 ms device sleep
    assert steps.input_ms.mean > steps.compute_ms.mean * 0.8
    assert steps.compute_ms.mean >= 7.5
    for step in steps.steps:
        assert step.input_ms + step.compute_ms == pytest.approx(step.step_ms)
        assert step.get_next_calls == 1


def test_healthy_loop_is_not_input_bound(healthy_profile):
    steps = step_breakdown(load_profile(healthy_profile))
    assert steps.verdict == "not"
    assert steps.input_share < 0.05
    assert steps.step_ms.p50 <= steps.step_ms.p90


def test_spread_statistics():
    spread = Spread.of([1.0, 2.0, 3.0, 4.0])
    assert spread.mean == 2.5
    assert spread.p50 == 2.5
    assert spread.p90 == pytest.approx(3.7)
    assert spread.std == pytest.approx(1.118, abs=1e-3)
    assert Spread.of([]) == Spread(0.0, 0.0, 0.0, 0.0)


def test_run_timing_reads_steps_csv_without_warmup(rewritten_run):
    records = read_steps(rewritten_run)
    timing = run_timing(records)
    assert timing.steps == len(records) - 1
    assert 0.0 <= timing.input_share <= 1.0
    assert timing.images_per_second > 0


def test_a_callbacks_steps_have_no_input_split_and_say_so(tmp_path):
    """StallMonitor's steps.csv: whole steps, no input wait (NaN), batch size unknown (0). The run's
    timing leaves out the split, share and verdict instead of reading NaN as 'not input-bound'."""
    import json
    import math

    from stallscope.workload.rundir import StepRecord, write_steps

    records = [StepRecord(step=i, phase="train", started_s=i * 0.01, step_ms=10.0 + i, input_wait_ms=math.nan,
                          compute_ms=math.nan, images=0, warmup=i == 1) for i in range(1, 6)]
    write_steps(tmp_path, records)
    timing = run_timing(read_steps(tmp_path))
    assert timing.steps == 4 and timing.step_ms.mean == pytest.approx(13.5)
    assert timing.input_ms is None and timing.input_share is None and timing.verdict is None
    assert timing.images_per_second is None
    json.dumps(timing.__dict__ | {"step_ms": timing.step_ms.__dict__}, allow_nan=False)
