"""`stallscope sweep --precision` and `--cold` on tiny data: every run measures to the precision as
`train --precision` does and its row says what it reached; cold cells are named apart from warm ones
and say where --cold is not applicable (gs://); the report warns of a run that missed its precision."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stallscope.sweep.figures import Cell, CellResult, RunFigures
from stallscope.sweep.grid import Axes, Grid
from stallscope.sweep.runner import profile_window, repeat_complete, train_command
from stallscope.workload.precision import PrecisionTarget

from .helpers import TINY_KNOBS, csv_rows, run_cli, summary_rows

# A loose target and a short minimum: the tiny runs reach it or stop at --max-seconds; either is allowed.
PRECISION = ["--precision", "20%", "--min-seconds", "0.2s", "--max-seconds", "3s"]


def precision_args(data: Path, out: Path, *extra: str, latency: str = "local,0ms") -> list[str]:
    return ["sweep", "--data", str(data), "--out", str(out), "--latency", latency, "--pipeline", "seed",
            "--accelerator", "emulated:4000", "--warmup-steps", "1", "--repeats", "1", *TINY_KNOBS, *PRECISION,
            *extra]


@pytest.fixture(scope="module")
def cold_swept(tiny_tree, tmp_path_factory) -> Path:
    """Local disk and an emulated gs:// store at 0 ms, each run cold and to 20%."""
    out = tmp_path_factory.mktemp("sweeps") / "cold"
    assert run_cli(precision_args(tiny_tree, out, "--cold")) == 0
    return out


def test_each_run_carries_the_precision_it_reached(cold_swept):
    rows = csv_rows(cold_swept)
    assert len(rows) == 2
    for row in rows:
        assert float(row["precision_target_pct"]) == pytest.approx(20.0)
        assert row["stopped_by"] in ("precision", "max_seconds")
        assert row["precision_reached"] in ("True", "False")
        spread = float(row["precision_spread_pct"])
        assert spread >= 0.0
        if row["stopped_by"] == "precision":
            assert row["precision_reached"] == "True" and spread <= 20.0
            assert float(row["measured_s"]) >= 0.2
        # The same figure the run stopped on: train's own precision, over the same steps.
        summary = json.loads((cold_swept / row["run_dir"] / "summary.json").read_text(encoding="utf-8"))
        assert summary["precision"]["target"] == pytest.approx(0.2)
        assert spread == pytest.approx(summary["precision"]["spread"] * 100)
        assert int(row["measured_steps"]) == summary["measured_steps"]
    for row in summary_rows(cold_swept):
        assert float(row["precision_spread_pct_max"]) >= 0.0 and row["precision_reached_runs"] in ("0", "1")


def test_runs_to_a_precision_profile_the_steps_after_the_warm_up(cold_swept):
    """The profiled steps count as the run's warm-up, so its precision leaves them out as the figures do."""
    for row in csv_rows(cold_swept):
        log = (cold_swept / row["run_dir"]).with_suffix(".log").read_text(encoding="utf-8")
        command = log.splitlines()[0]
        assert "--precision 0.2 " in command and "--steps" not in command
        assert "--warmup-steps 3 " in command and "--profile-steps 2:3" in command
        assert row["bottleneck"], "the profile of the steps after the warm-up names a stage"


def test_cold_cells_are_named_apart_and_say_where_cold_is_not_applicable(cold_swept):
    rows = {row["store"]: row for row in csv_rows(cold_swept)}
    assert all(row["cell"].endswith("-cold") and row["cold"] == "True" for row in rows.values())
    assert rows["local"]["cold_start"] == "evicted"
    assert rows["gcs"]["cold_start"] == "not applicable"
    cold = json.loads((cold_swept / rows["gcs"]["run_dir"] / "summary.json").read_text(encoding="utf-8"))["cold"]
    assert cold["applied"] is False and cold["how"].startswith("not applicable to gs://")
    table = (cold_swept / "results.md").read_text(encoding="utf-8")
    assert "gs:// (cold: not applicable)" in table and "local disk (cold: evicted)" in table
    assert "(cold: not applicable)" in (cold_swept / "report.html").read_text(encoding="utf-8")


def test_a_resumed_cold_sweep_never_mixes_in_warm_runs(cold_swept, tiny_tree, tmp_path, capsys):
    capsys.readouterr()
    assert run_cli(precision_args(tiny_tree, cold_swept, "--cold")) == 0
    assert "runs: 0 ran, 2 already complete" in capsys.readouterr().out
    assert run_cli(precision_args(tiny_tree, cold_swept)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "holds another grid (cold: " in err and "--replace-grid" in err
    out = tmp_path / "copy"
    shutil.copytree(cold_swept, out)
    assert run_cli(precision_args(tiny_tree, out, "--replace-grid", latency="local")) == 0
    assert "runs: 1 ran, 0 already complete" in capsys.readouterr().out
    [row] = csv_rows(out)
    assert row["cold"] == "False" and not row["cold_start"] and not row["cell"].endswith("-cold")
    cells = sorted(p.name for p in (out / "cells").iterdir())
    assert row["cell"] in cells and row["cell"] + "-cold" in cells, "the cold runs are kept in their own cell"


def test_a_warm_cell_keeps_the_settings_it_had_before_cold_cells_existed():
    warm = Cell(format="files", store="local", latency="local", pipeline="seed", accelerator="real",
                learning_rate=1e-4)
    cold = Cell(format="files", store="local", latency="local", pipeline="seed", accelerator="real",
                learning_rate=1e-4, cold=True)
    assert "cold" not in warm.to_dict() and cold.to_dict()["cold"] is True
    assert cold.name == warm.name + "-cold"
    grid = Grid(axes=Axes(), repeats=1, shared={"cold": True, "steps": 10})
    assert [c.cold for c in grid.cells()] == [True]


def test_train_command_and_completeness_for_a_run_to_a_precision(tmp_path):
    shared = {"split": "train", "steps": None, "warmup_steps": 2, "profile_last": 2, "model": "mobilenet",
              "alpha": 1.0, "weights": "none", "fine_tune": "head", "cold": True,
              "precision": PrecisionTarget(0.05, 1.0, 60.0).to_dict()}
    grid = Grid(axes=Axes(), repeats=1, shared=shared)
    command = train_command(grid, grid.cells()[0], "data", tmp_path / "p.json", tmp_path / "run")
    text = " ".join(command)
    assert "--precision 0.05 --min-seconds 1.0 --max-seconds 60.0 --warmup-steps 4" in text
    assert "--profile-steps 3:4" in text and command[-1] == "--cold" and "--steps" not in command
    assert profile_window(shared) == (3, 4)
    assert profile_window({**shared, "profile_last": 0}) is None

    def record(**summary):
        run_dir = tmp_path / str(len(list(tmp_path.iterdir())))
        run_dir.mkdir()
        (run_dir / "steps.csv").write_text("step\n", encoding="utf-8")
        (run_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
        return run_dir

    assert repeat_complete(record(interrupted=False, last_step=40, precision={"stopped_by": "precision"}), None)
    assert repeat_complete(record(interrupted=False, last_step=90, precision={"stopped_by": "max_seconds"}), None)
    assert not repeat_complete(record(interrupted=True, last_step=9, precision={"stopped_by": "interrupted"}), None)
    assert not repeat_complete(record(interrupted=False, last_step=20, precision={"stopped_by": "steps"}), None)


def _result(*runs: RunFigures) -> CellResult:
    cell = Cell(format="files", store="local", latency="local", pipeline="seed", accelerator="emulated:500",
                learning_rate=1e-4)
    return CellResult(cell=cell, repeats_asked=len(runs), runs=runs, images_per_second=100.0,
                      images_per_second_interval=None, step_time_ms=10.0, input_wait_ms=9.0, compute_ms=1.0,
                      input_share=0.9, input_share_interval=None, verdict="highly", bottleneck=None,
                      device_images_per_second=500.0, final_loss=None, client=None, requests_per_image=None,
                      bytes_per_image=None)


def _run(repeat: int, spread: float, reached: bool, warning: str | None = None) -> RunFigures:
    return RunFigures(repeat=repeat, run_dir=f"cells/x/repeat-{repeat}", images_per_second=100.0, step_time_ms=10.0,
                      input_wait_ms=9.0, compute_ms=1.0, input_share=0.9, verdict="highly", measured_steps=50,
                      batch_size=4, slowest_stage=None, bottleneck=None, final_loss=None, client=None,
                      requests_per_image=None, bytes_per_image=None, precision_spread=spread, precision_target=0.05,
                      precision_reached=reached, measured_s=60.0,
                      stopped_by="precision" if reached else "max_seconds", precision_warning=warning)


def test_the_report_warns_of_a_run_that_missed_its_precision():
    from stallscope.cli.sweep import precision_notes
    from stallscope.sweep.table import markdown_cells, precision_text

    missed = "too short to trust: the images/s of its halves, 90 and 110, differ by 20% (more than 5%)"
    result = _result(_run(1, 0.02, True), _run(2, 0.2, False, missed))
    assert precision_text(result) == "20.0% (1/2 not within 5%)"
    assert "20.0% (1/2 not within 5%)" in markdown_cells(result)
    notes = precision_notes([result], {"tolerance": 0.05, "min_seconds": 5.0, "max_seconds": 60.0})
    assert notes == [f"warning: {result.cell.name} repeat 2: {missed}"]
    assert precision_text(_result(_run(1, 0.02, True), _run(2, 0.031, True))) == "3.1%"
    assert precision_notes([_result(_run(1, 0.02, True))], {"tolerance": 0.05}) == []


@pytest.mark.parametrize("extra, expected", [
    (["--precision", "5%", "--steps", "20"], "--precision: runs until its figure is that precise; --steps fixes"),
    (["--precision", "lots"], "--precision: expected a share such as 5% or 0.05, got 'lots'"),
    (["--precision", "150%"], "--precision: expected a share such as 5% or 0.05, got '150%'"),
    (["--precision", "5%", "--min-seconds", "10s", "--max-seconds", "5s"],
     "--max-seconds: expected at least --min-seconds (10s), got 5s"),
    (["--precision", "5%", "--min-seconds", "0"], "--min-seconds: expected a duration above 0, got '0'"),
])
def test_bad_precision_flags_are_one_line_exit_2(tiny_tree, tmp_path, capsys, extra, expected):
    argv = ["sweep", "--data", str(tiny_tree), "--out", str(tmp_path / "s"), "--accelerator", "emulated:100", *extra]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("stallscope sweep: error: ") and expected in err, err
    assert not (tmp_path / "s").exists(), "nothing written for a refused command"
