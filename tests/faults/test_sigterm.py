"""SIGTERM, as a scheduler or `kill PID` sends it, stops every command as Ctrl-C does: one line
"stallscope CMD: interrupted", exit 130, what was measured written and marked interrupted, nothing left
in the temporary folder (a diagnosis's probe folder, autograph's generated files). A sweep killed by
`kill -9` leaves no run behind, and its resume refuses while a run of the killed sweep still runs.

Each command runs with a TMPDIR of the test's own, so what it leaves there is seen. The signal is sent
once the command shows it is under way (a line printed, a folder made), never after a guessed sleep."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from stallscope.sweep.runner import RUNNING_NAME, record_running

START_S = 180  # until TensorFlow has loaded and the command is under way, on a loaded machine
STOPPED_WITHIN_S = 60.0  # from the signal to the exit: the run writes what it measured first
TINY = ["--image-size", "32", "--batch-size", "4", "--shuffle-buffer", "0"]


def _own_tmpdir(tmp_path: Path) -> Path:
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    return folder


def _left_in(tmpdir: Path) -> list[str]:
    """What a stallscope process left in its temporary folder: its folders, autograph's files."""
    return sorted(p.name for p in tmpdir.iterdir()
                  if p.name.startswith(("stallscope-", "__autograph_generated_file")))


def _stopped_by_sigterm(run, command: str, tmpdir: Path) -> None:
    run.send(signal.SIGTERM)
    outcome = run.finish(STOPPED_WITHIN_S + 60)
    outcome.check(rc=130, within_s=STOPPED_WITHIN_S)
    assert outcome.stderr_lines == [f"stallscope {command}: interrupted"]
    assert _left_in(tmpdir) == [], "the command's temporary files are removed"


@pytest.mark.timeout(400)
def test_train_stopped_by_sigterm_writes_what_it_measured_marked_interrupted(faults, tiny_tree, tmp_path):
    """Before: exit 143, no line, no summary.json or steps.csv, autograph's files left in TMPDIR."""
    tmpdir = _own_tmpdir(tmp_path)
    run_dir = tmp_path / "run"
    run = faults.launch("train SIGTERM", ["train", "--dataset_path", tiny_tree, "--accelerator", "emulated:2000",
                                          "--steps", "1000000", "--log-every", "1", "--log_path", run_dir, *TINY],
                        env={"TMPDIR": str(tmpdir)})
    run.wait_for(lambda: "\nstep 3 " in run.stdout_so_far(), START_S, "third step line")
    _stopped_by_sigterm(run, "train", tmpdir)
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["interrupted"] is True and summary["precision"]["stopped_by"] == "interrupted"
    assert summary["last_step"] >= 3
    steps = (run_dir / "steps.csv").read_text(encoding="utf-8").splitlines()
    assert len(steps) - 1 == summary["last_step"], "every step measured is in steps.csv"


@pytest.mark.timeout(400)
def test_evaluate_stopped_by_sigterm_while_it_waits_for_a_checkpoint(faults, tiny_tree, tmp_path):
    """Before: exit 143 and no line."""
    tmpdir = _own_tmpdir(tmp_path)
    run = faults.launch("evaluate --watch SIGTERM", ["evaluate", "--checkpoint_path", tmp_path / "ckpt",
                                                      "--dataset_path", tiny_tree, "--split", "train", "--watch"],
                        env={"TMPDIR": str(tmpdir)})
    run.wait_for(lambda: "waiting for" in run.stdout_so_far(), START_S, "line saying it waits for a checkpoint")
    _stopped_by_sigterm(run, "evaluate", tmpdir)


@pytest.mark.timeout(400)
def test_diagnose_stopped_by_sigterm_removes_its_probe_folder(faults, tiny_tree, tmp_path):
    """Before: exit 143, no line, and $TMPDIR/stallscope-diagnose-* left for good."""
    tmpdir = _own_tmpdir(tmp_path)
    run = faults.launch("diagnose SIGTERM", ["diagnose", "--dataset_path", tiny_tree, "--accelerator",
                                             "emulated:2000", "--probe-steps", "200", *TINY],
                        env={"TMPDIR": str(tmpdir)})
    run.wait_for(lambda: any(p.name.startswith("stallscope-diagnose-") for p in tmpdir.iterdir()), START_S,
                 "probe folder in TMPDIR")
    _stopped_by_sigterm(run, "diagnose", tmpdir)


def _sweep_args(data: Path, out: Path) -> list:
    return ["sweep", "--data", data, "--out", out, "--format", "files", "--pipeline", "seed",
            "--accelerator", "emulated:2000", "--steps", "1000000", "--warmup-steps", "1", "--repeats", "1",
            "--profile-last", "0", *TINY]


@pytest.mark.timeout(400)
def test_a_killed_sweep_leaves_no_run_and_its_resume_refuses_while_a_run_of_the_cell_lives(faults, tiny_tree,
                                                                                           tmp_path):
    """`kill -9` of the sweep: its run ends too (the kernel sends it SIGINT). A run the record names that
    still runs (planted here: a live process) makes the resume refuse in one line naming the cell and the
    PID, instead of running the cell a second time beside it. Before: the resume ran the cell again."""
    out = tmp_path / "sweep"
    sweep = faults.launch("sweep kill -9", _sweep_args(tiny_tree, out))
    sweep.wait_for(lambda: list(out.glob("cells/*/repeat-1/train")) and sweep.children(), START_S, "run under way")
    runs = sweep.children()
    cell = next(out.glob("cells/*/repeat-1")).parent.name
    sweep.send(signal.SIGKILL)
    killed = sweep.finish(60)
    assert killed.rc == -signal.SIGKILL
    _, alive = psutil.wait_procs(runs, timeout=STOPPED_WITHIN_S)
    assert alive == [], f"the runs outlived the killed sweep: {alive}"
    assert killed.orphans == []

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        record_running(out, cell, 1, holder.pid)
        refused = faults.run("sweep resumed beside a live run", _sweep_args(tiny_tree, out), 120)
        assert holder.poll() is None, "the live run is left alone"
    finally:
        holder.kill()
        holder.wait()
    refused.check(rc=2, within_s=120)
    assert f"cell {cell}" in refused.stderr and f"PID {holder.pid}" in refused.stderr
    assert json.loads((out / RUNNING_NAME).read_text(encoding="utf-8"))["pid"] == holder.pid, "no run was started beside it"


@pytest.mark.timeout(400)
def test_autograph_files_of_a_killed_train_are_kept_together_and_removed_by_the_next_run(faults, tiny_tree, tmp_path):
    """`kill -9` runs no exit handler: autograph's generated files stay, but in the killed process's own
    marked folder, which the next stallscope command that loads TensorFlow removes. Before: loose
    `__autograph_generated_file*.py` in TMPDIR for good."""
    tmpdir = _own_tmpdir(tmp_path)
    env = {"TMPDIR": str(tmpdir)}
    run = faults.launch("train kill -9", ["train", "--dataset_path", tiny_tree, "--accelerator", "emulated:2000",
                                          "--steps", "1000000", "--log-every", "1", "--log_path", tmp_path / "run",
                                          *TINY], env=env)
    run.wait_for(lambda: "\nstep 3 " in run.stdout_so_far(), START_S, "third step line")
    run.send(signal.SIGKILL)
    run.finish(60).check(rc=-signal.SIGKILL, within_s=60, stderr_lines=0)
    left = _left_in(tmpdir)
    assert len(left) == 1 and left[0].startswith("stallscope-autograph-"), left
    assert list((tmpdir / left[0]).glob("__autograph_generated_file*.py")), "the killed run's files are in its folder"

    after = faults.run("evaluate after a killed train", ["evaluate", "--checkpoint_path", tmp_path / "none",
                                                         "--dataset_path", tiny_tree, "--split", "train"], 180, env=env)
    after.check(rc=2, within_s=180)
    assert _left_in(tmpdir) == [], "the killed process's folder is removed, the next run's own too"


@pytest.mark.timeout(400)
def test_train_whose_data_service_stops_writes_what_it_measured_marked_interrupted(faults, tiny_tree, tmp_path):
    """The service's only worker stopped mid-run: the run ends in its one line as before, and now
    writes summary.json and steps.csv with the steps it took, marked interrupted. Before: no summary."""
    from stallscope.service import servers

    dispatcher = servers.start_dispatcher()
    worker = servers.start_worker(f"127.0.0.1:{dispatcher.port}", timeout_s=30)
    run_dir = tmp_path / "run"
    try:
        run = faults.launch("train --data-service, worker stopped", [
            "train", "--dataset_path", tiny_tree, "--accelerator", "emulated:2000", "--steps", "1000000",
            "--log-every", "1", "--log_path", run_dir, "--data-service", dispatcher.target,
            "--data-service-timeout", "5s", *TINY])
        run.wait_for(lambda: "\nstep 3 " in run.stdout_so_far(), START_S, "third step line")
        worker.stop()
        outcome = run.finish(120)
    finally:
        worker.stop()
        dispatcher.stop()
    outcome.check(rc=2, within_s=120)
    assert "sent no batch for 5 s" in outcome.stderr
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["interrupted"] is True and summary["last_step"] >= 3
    assert len((run_dir / "steps.csv").read_text(encoding="utf-8").splitlines()) - 1 == summary["last_step"]
