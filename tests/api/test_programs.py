"""The user's own program, run for real: a Keras fit with StallMonitor and a custom loop with
stallscope.step/profile. The profile's step time must agree with the program's own wall clock of the
same steps, and the stalled pipeline must read as highly input-bound with its map named."""

from __future__ import annotations

import csv

import pytest

AGREEMENT = 0.10


def _agreement(result: dict) -> tuple[float, float]:
    profiled = {int(k): v for k, v in result["analysis"]["profile_step_ms"].items()}
    own = {int(k): v for k, v in result["own_step_ms"].items()}
    assert len(profiled) >= 5, profiled
    steps = sorted(profiled)
    return (sum(profiled[s] for s in steps) / len(steps), sum(own[s] for s in steps) / len(steps))


def _assert_verdicts(stalled: dict, healthy: dict) -> None:
    assert stalled["analysis"]["verdict"] == "highly", stalled["analysis"]
    assert "Map" in stalled["analysis"]["bottleneck"], stalled["analysis"]
    assert healthy["analysis"]["verdict"] == "not", healthy["analysis"]
    for result in (stalled, healthy):
        profile_ms, own_ms = _agreement(result)
        assert abs(profile_ms - own_ms) <= AGREEMENT * own_ms, (profile_ms, own_ms)


def test_keras_fit_with_stall_monitor(run_program, tmp_path):
    stalled = run_program("keras_fit.py", "stalled", str(tmp_path / "stalled"))
    healthy = run_program("keras_fit.py", "healthy", str(tmp_path / "healthy"))
    _assert_verdicts(stalled, healthy)
    with open(tmp_path / "healthy" / "steps.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == list(range(1, 25))  # two epochs of 12, numbered globally
    assert all(float(r["step_ms"]) > 0 for r in rows)


def test_stall_monitor_without_a_window_still_times_every_step(run_program, tmp_path):
    result = run_program("keras_fit.py", "healthy", str(tmp_path / "run"), "--no-window")
    assert result["analysis"] is None
    assert not (tmp_path / "run" / "profile").exists()
    with open(tmp_path / "run" / "steps.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    own = {int(k): v for k, v in result["own_step_ms"].items()}
    assert len(rows) == 24
    for row in rows[2:]:
        assert float(row["step_ms"]) == pytest.approx(own[int(row["step"])], rel=0.5, abs=2.0)


def test_custom_loop_with_step_and_profile(run_program, tmp_path):
    stalled = run_program("custom_loop.py", "stalled", str(tmp_path / "stalled"))
    healthy = run_program("custom_loop.py", "healthy", str(tmp_path / "healthy"))
    _assert_verdicts(stalled, healthy)


def test_step_markers_make_a_profile_taken_by_hand_analysable(run_program, tmp_path):
    """The one line a user adds: stallscope.step alone, profiled with TF's own start/stop."""
    stalled = run_program("custom_loop.py", "stalled", str(tmp_path / "stalled"), "--external")
    assert stalled["analysis"]["verdict"] == "highly"
    profile_ms, own_ms = _agreement(stalled)
    assert abs(profile_ms - own_ms) <= AGREEMENT * own_ms, (profile_ms, own_ms)
