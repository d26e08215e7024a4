"""Runs a sweep's cells: each repeat of each cell is one `stallscope train` in its own process.

A process per run keeps runs apart (TF's thread pools, caches and tracing start fresh; one run's
leftovers cannot slow the next) and runs never overlap, so each measures the machine alone.

Layout of a sweep folder (everything in it is the sweep's own):

    SWEEP_DIR/sweep.json                the grid; a resumed sweep must match it
    SWEEP_DIR/records/                  the data converted once to TFRecords (format `records`)
    SWEEP_DIR/cells/NAME/cell.json      the cell's settings
    SWEEP_DIR/cells/NAME/pipeline.json  the PipelineConfig its runs use
    SWEEP_DIR/cells/NAME/repeat-N/      a normal run directory (`stallscope train --log-path`)
    SWEEP_DIR/cells/NAME/repeat-N.log   that run's output
    SWEEP_DIR/cells/NAME/repeat-N/storage.json  where it read from (the cell's store); an emulated store's
                                        counters
    SWEEP_DIR/running.json              the run under way: its cell, repeat, PID and the PID's start time

A repeat is complete only when its run directory's summary.json says it reached the last step (with
--precision: its precision or --max-seconds) and was not interrupted; anything else is partial, removed
and run again.

A run ends with its sweep, even one killed by `kill -9` (the kernel sends the run SIGINT: it writes what
it measured, marked interrupted). Writing that takes a moment, so a sweep resumed at once refuses, naming
the cell and the PID, while the run recorded in running.json still runs: two runs of one cell at once
would each measure the other's load.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stallscope.errors import StallscopeError, UsageError
from stallscope.lifetime import dying_with_parent, start_time, still_running
from stallscope.pipeline.presets import apply_overrides, get_preset
from stallscope.records.manifest import write_json_atomic
from stallscope.sweep.grid import Cell, Grid
from stallscope.sweep.storage import cell_data
from stallscope.workload import rundir

log = logging.getLogger(__name__)

GRID_NAME = "sweep.json"
CELLS_DIR = "cells"
RECORDS_DIR = "records"
CELL_NAME = "cell.json"
PIPELINE_NAME = "pipeline.json"
_STOP_GRACE_S = 30.0
_STORE_LIFE_S = 7 * 24 * 3600.0  # an emulated store's bound without --run-timeout (it also ends with us)
STORAGE_NAME = "storage.json"
RUNNING_NAME = "running.json"
_PRECISION_LOG_EVERY = 100  # a run to a precision has no last step to log at: a line every 100 steps


class RunFailed(StallscopeError):
    """A run's own usage or data error (exit 2): every cell would fail the same way, so the sweep stops."""


class RunStillRunning(StallscopeError):
    """A run an earlier sweep started in this folder still runs: a resume now would run beside it."""


def record_running(out: Path, cell_name: str, repeat: int, pid: int) -> None:
    """Notes the run under way in the sweep folder (its PID with its start time: a reused PID is not it)."""
    write_json_atomic(Path(out) / RUNNING_NAME, {"cell": cell_name, "repeat": repeat, "pid": pid,
                                                 "started": start_time(pid)})


def refuse_while_a_run_lives(out: Path) -> None:
    """Raises RunStillRunning where the run an earlier sweep recorded in `out` still runs (a sweep
    killed a moment ago: its run is still writing what it measured); forgets a record of one that ended."""
    path = Path(out) / RUNNING_NAME
    try:
        running = json.loads(path.read_text(encoding="utf-8"))
        cell, repeat, pid, started = running["cell"], int(running["repeat"]), int(running["pid"]), running.get("started")
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError):
        log.info("%s: not a record of a run; ignored", path)
        return
    if still_running(pid, started):
        raise RunStillRunning(f"cell {cell}: its repeat {repeat}, started by an earlier sweep into {str(out)!r}, "
                              f"still runs as PID {pid}; wait for it to end (or stop it: kill {pid}), then run "
                              f"the same command again")
    path.unlink(missing_ok=True)


def repeat_dir(cell_dir: Path, repeat: int) -> Path:
    return cell_dir / f"repeat-{repeat}"


def profile_window(shared: dict[str, Any]) -> tuple[int, int] | None:
    """The `profile_last` steps of each run profiled for the bottleneck (None: not profiled): its last
    ones with a fixed --steps; with --precision, whose last step is not known ahead, the ones right
    after the warm-up, which the run counts as warm-up too (train_command), so the precision it
    measures itself is over the same steps as the sweep's figures."""
    last = shared["profile_last"]
    if not last:
        return None
    if shared.get("steps") is None:
        first = shared["warmup_steps"] + 1
        return first, first + last - 1
    return shared["steps"] - last + 1, shared["steps"]


# How a run to a precision may end and count as complete (not "interrupted").
_PRECISION_ENDS = ("precision", "max_seconds", "data_end")


def repeat_complete(run_dir: Path, steps: int | None) -> bool:
    """True only when the run's own record says it ran to `steps` (None: until its precision or
    --max-seconds) without being interrupted."""
    try:
        summary = json.loads((run_dir / rundir.SUMMARY_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not (isinstance(summary, dict) and summary.get("interrupted") is False
            and (run_dir / rundir.STEPS_NAME).exists()):
        return False
    if steps is None:
        return (summary.get("precision") or {}).get("stopped_by") in _PRECISION_ENDS
    return summary.get("last_step") == steps


def cell_settings(grid: Grid, cell: Cell) -> dict[str, Any]:
    """Everything that decides a cell's runs; a cell folder holding other settings is stale."""
    return {"cell": cell.to_dict(), "repeats": grid.repeats, "shared": grid.shared}


def train_command(grid: Grid, cell: Cell, data_path: str, pipeline_file: Path, run_dir: Path) -> list[str]:
    """The `stallscope train` command line of one run."""
    shared = grid.shared
    command = [sys.executable, "-m", "stallscope", "train", "--source", cell.format, "--dataset-path", data_path,
               "--split", shared["split"], "--pipeline-config", str(pipeline_file),
               "--accelerator", cell.accelerator, "--learning-rate", repr(cell.learning_rate),
               "--log-path", str(run_dir),
               "--model", shared["model"], "--alpha", repr(shared["alpha"]), "--weights", shared["weights"],
               "--fine-tune", shared["fine_tune"]]
    window = profile_window(shared)
    precision = shared.get("precision")
    if precision:  # train's own --precision: it runs until the halves agree (workload/precision.py)
        warmup = shared["warmup_steps"] + (shared["profile_last"] if window else 0)
        command += ["--precision", repr(precision["tolerance"]), "--min-seconds", repr(precision["min_seconds"]),
                    "--max-seconds", repr(precision["max_seconds"]), "--warmup-steps", str(warmup),
                    "--log-every", str(_PRECISION_LOG_EVERY)]
    else:
        command += ["--steps", str(shared["steps"]), "--warmup-steps", str(shared["warmup_steps"]),
                    "--log-every", str(shared["steps"])]
    if window:
        command += ["--profile-steps", f"{window[0]}:{window[1]}"]
    if shared.get("cold"):
        command.append("--cold")
    return command


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    """Our environment plus the store's; the child imports this same stallscope."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the folder above stallscope/
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def _last_error_line(log_path: Path) -> str:
    try:
        lines = [line for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if ": error: " in line]
    return (errors or lines or [""])[-1].strip()


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    cell: Cell
    repeat: int
    run_dir: Path
    ran: bool            # False: already complete, skipped
    failure: str | None  # why a run that ran did not complete


class Sweep:
    """Runs the missing repeats of a grid's cells in a sweep folder."""

    def __init__(self, grid: Grid, out: Path, *, records_path: Path | None, run_timeout_s: float | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        self.grid = grid
        self.out = Path(out)
        self.records_path = records_path
        self.run_timeout_s = run_timeout_s
        self.on_event = on_event or (lambda line: None)

    def cell_dir(self, cell: Cell) -> Path:
        return self.out / CELLS_DIR / cell.name

    def local_data(self, cell: Cell) -> Path:
        if cell.format == "records":
            if self.records_path is None:
                raise UsageError("--format: records needs the data converted first (internal: no records path)")
            return self.records_path
        return Path(self.grid.shared["dataset_path"])

    def pending(self) -> list[tuple[Cell, int]]:
        """(cell, repeat) pairs whose run is not complete."""
        return [(cell, repeat) for cell in self.grid.cells() for repeat in range(1, self.grid.repeats + 1)
                if not self._current(cell) or not repeat_complete(repeat_dir(self.cell_dir(cell), repeat),
                                                                  self.grid.shared["steps"])]

    def _current(self, cell: Cell) -> bool:
        """The cell folder was made for these settings (a --replace-grid may have changed shared ones)."""
        try:
            saved = json.loads((self.cell_dir(cell) / CELL_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return saved == json.loads(json.dumps(cell_settings(self.grid, cell)))

    def _prepare_cell(self, cell: Cell) -> Path:
        """The cell folder with this grid's settings; runs made under other settings are removed (the
        folder and everything in it is the sweep's own)."""
        folder = self.cell_dir(cell)
        if folder.exists() and not self._current(cell):
            log.info("%s: settings changed; removing its earlier runs", folder)
            for repeat in range(1, 1 + max(self.grid.repeats, _highest_repeat(folder))):
                shutil.rmtree(repeat_dir(folder, repeat), ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        pipeline = apply_overrides(get_preset(cell.pipeline), self.grid.shared["knobs"])
        pipeline.save(folder / PIPELINE_NAME)
        write_json_atomic(folder / CELL_NAME, cell_settings(self.grid, cell))
        return folder

    def run(self) -> list[RunOutcome]:
        """Runs every missing repeat, repeat by repeat over the grid (every cell's first run, then every
        cell's second, ...): a cell's repeats are spread over the sweep, so what drifts while it runs (the
        machine's load, its caches, its clock) goes into each cell's spread and interval instead of
        shifting whole cells; returns what happened to each run, in grid order."""
        refuse_while_a_run_lives(self.out)
        outcomes: dict[tuple[int, int], RunOutcome] = {}
        todo = set(self.pending())
        cells = self.grid.cells()
        total = len(cells) * self.grid.repeats
        done = total - len(todo)
        if done:
            self.on_event(f"resuming: {done} of {total} runs already complete, {len(todo)} to run")
        folders = [self.cell_dir(cell) if not any(c == cell for c, _ in todo) else self._prepare_cell(cell)
                   for cell in cells]
        for repeat in range(1, self.grid.repeats + 1):
            for index, (cell, folder) in enumerate(zip(cells, folders)):
                run_dir = repeat_dir(folder, repeat)
                if (cell, repeat) not in todo:
                    outcomes[index, repeat] = RunOutcome(cell, repeat, run_dir, ran=False, failure=None)
                    continue
                outcomes[index, repeat] = self._run_one(cell, repeat, folder, run_dir, done + 1, total)
                done += 1
        return [outcomes[key] for key in sorted(outcomes)]

    def _run_one(self, cell: Cell, repeat: int, folder: Path, run_dir: Path, index: int, total: int) -> RunOutcome:
        if run_dir.exists():  # partial: an interrupted or failed attempt of ours
            shutil.rmtree(run_dir)
        log_path = folder / f"repeat-{repeat}.log"
        label = f"[{index}/{total}] {cell.name} repeat {repeat}/{self.grid.repeats}"
        store_life_s = self.run_timeout_s + _STOP_GRACE_S + 60 if self.run_timeout_s else _STORE_LIFE_S
        with cell_data(self.local_data(cell), cell.latency, store=cell.store, bandwidth_bps=cell.bandwidth_bps,
                       max_duration_s=store_life_s) as data:
            command = train_command(self.grid, cell, data.path, folder / PIPELINE_NAME, run_dir)
            started = time.perf_counter()
            code = self._execute(command, _child_env(data.env), log_path, cell, repeat)
            served = data.counters() if data.counters else None
        if run_dir.is_dir():
            write_json_atomic(run_dir / STORAGE_NAME, {"where": data.where, "latency": cell.latency,
                                                       "store": cell.store,
                                                       "served": served})
        if code == 0 and repeat_complete(run_dir, self.grid.shared["steps"]):
            self.on_event(f"{label}: done in {time.perf_counter() - started:.1f} s")
            return RunOutcome(cell, repeat, run_dir, ran=True, failure=None)
        reason = _last_error_line(log_path)
        if code == 2:
            raise RunFailed(f"cell {cell.name}: {reason or 'stallscope train refused its flags'} (log: {log_path})")
        failure = f"exit {code}: {reason}" if code is not None else f"stopped after --run-timeout {self.run_timeout_s:g}s"
        self.on_event(f"{label}: failed ({failure}; log: {log_path})")
        return RunOutcome(cell, repeat, run_dir, ran=True, failure=failure)

    def _execute(self, command: list[str], env: dict[str, str], log_path: Path, cell: Cell, repeat: int) -> int | None:
        """Runs one train process to its end (None: stopped at the timeout). Ctrl-C stops it too, by
        its PID, letting it write its interrupted record first. The run is recorded in RUNNING_NAME
        while it runs."""
        with open(log_path, "w", encoding="utf-8") as output:
            output.write("$ " + " ".join(command) + "\n")
            output.flush()
            child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=interrupted_when_the_sweep_dies())
            try:
                record_running(self.out, cell.name, repeat, child.pid)
                return child.wait(timeout=self.run_timeout_s)
            except subprocess.TimeoutExpired:
                _stop(child)
                return None
            except BaseException:  # Ctrl-C, SIGTERM, or the record refused by a full disk: the run ends too
                _stop(child)
                raise
            finally:
                if child.poll() is not None:
                    (self.out / RUNNING_NAME).unlink(missing_ok=True)


def interrupted_when_the_sweep_dies() -> Callable[[], None] | None:
    """A preexec_fn: the run gets SIGINT when the sweep dies, even by SIGKILL, so no run goes on
    unwatched beside a resumed sweep (the run writes its record, marked interrupted); a sweep that died
    before the child asked: the child ends (130) before it runs."""
    return dying_with_parent(signal.SIGINT, exit_code=130)


def _stop(child: subprocess.Popen) -> None:
    """SIGINT (the run writes what it measured, marked interrupted), then SIGKILL if it lingers."""
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _highest_repeat(folder: Path) -> int:
    numbers = [int(p.name.split("-", 1)[1]) for p in folder.glob("repeat-*")
               if p.is_dir() and p.name.split("-", 1)[1].isdigit()]
    return max(numbers, default=0)
