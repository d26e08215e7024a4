"""`stallscope diagnose --precision`: the end-to-end probes run as `train --precision` does, until the
images/s of their halves agree (at most --max-seconds), and the report states the precision reached."""

from __future__ import annotations

import json

import pytest

from stallscope.analysis.differential import precision_note
from stallscope.analysis.probes import LoopProbe
from stallscope.cli.main import main
from stallscope.workload.precision import PrecisionTarget
from stallscope.workload.rundir import StepRecord


def _exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_the_end_to_end_probe_runs_to_the_precision_and_the_report_says_what_it_reached(tiny_tree, capsys):
    code = main(["diagnose", "--dataset-path", str(tiny_tree), "--pipeline", "seed", "--batch-size", "4",
                 "--image-size", "32", "--accelerator", "emulated:4000", "--no-cold-cache", "--probe-steps", "4",
                 "--precision", "30%", "--min-seconds", "0.2s", "--max-seconds", "3s", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "until its halves agree within 30%" in captured.err  # the progress line
    report = json.loads(captured.out)
    probe = report["phases"][0]["probes"]["end_to_end"]
    assert probe["precision_target"] == pytest.approx(0.3)
    assert probe["stopped_by"] in ("precision", "max_seconds")
    assert probe["steps"] > 4, "a probe run to a precision is not the --probe-steps window"
    [note] = [n for n in report["notes"] if "--precision 30%" in n]
    if probe["stopped_by"] == "precision":
        assert probe["halves_spread"] <= 0.3 and not probe["too_short"]
        assert f"reached, its halves' images/s {probe['halves_spread']:.1%} apart" in note
    else:
        assert "not reached by --max-seconds 3 s" in note
    assert report["phases"][0]["probes"]["compute"]["precision_target"] is None, "only the end-to-end probes"


def _steps(step_ms):
    return [StepRecord(step=i + 1, phase="head", started_s=0.0, step_ms=ms, input_wait_ms=ms / 2, compute_ms=ms / 2,
                       images=8, warmup=i < 2) for i, ms in enumerate(step_ms)]


def test_a_probe_that_missed_its_precision_says_so():
    target = PrecisionTarget(0.05, 1.0, 60.0)
    uneven = LoopProbe.from_steps("end_to_end", "head", _steps([20.0] * 12 + [21.5] * 10),
                                  target=target, stopped_by="max_seconds")
    assert 0.05 < uneven.halves_spread < 0.10
    assert uneven.too_short, "beyond the 5% asked, though within the 10% a run is trusted at without a target"
    assert precision_note(uneven, target) == (
        f"the end-to-end probe (head) ran to --precision 5%: not reached by --max-seconds 60 s, its halves' "
        f"images/s {uneven.halves_spread:.1%} apart over 20 measured steps; raise --max-seconds or loosen --precision")
    steady = LoopProbe.from_steps("end_to_end", "head", _steps([20.0] * 22), target=target, stopped_by="precision")
    assert not steady.too_short and steady.precision_target == 0.05
    assert precision_note(steady, target).endswith("reached, its halves' images/s 0.0% apart over 20 measured steps")


@pytest.mark.parametrize("argv, message", [
    (["--precision", "lots"], "--precision: expected a share such as 5% or 0.05, got 'lots'"),
    (["--precision", "5%", "--min-seconds", "10s", "--max-seconds", "5s"],
     "--max-seconds: expected at least --min-seconds (10s), got 5s"),
    (["--precision", "5%", "--max-seconds", "-1"], "--max-seconds: expected a duration above 0"),
    (["--precision", "5%", "--dataset-fn", "x.py:f"], "--precision: applies to stallscope's own data source"),
])
def test_bad_precision_flags_end_in_one_line(tmp_path, capsys, argv, message):
    code = _exit_code(["diagnose", "--dataset-path", str(tmp_path), "--accelerator", "emulated:1000"] + argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and message in err, err
