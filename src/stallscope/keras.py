"""`StallMonitor`: a Keras callback that makes a `model.fit` analysable by stallscope.

Each training step runs inside a step marker (`Trace('train', step_num=i, _r=1)`, opened in
`on_train_batch_begin` and closed in `on_train_batch_end`), the window `profile_steps` is profiled,
and at the end of training the profile is analysed and the verdict, bottleneck and top fix logged;
`monitor.analysis` holds the `Analysis`. Every step's wall time goes to LOG_DIR/steps.csv and the CPU
the fit used (and, in a container, how often its CPU quota ran out) to LOG_DIR/resources.json. A callback
sees only whole batches, so input wait and compute per step are left unmeasured there (NaN): the
split comes from the profile.

Steps are numbered in batches: under `steps_per_execution=N` one step (one call of Keras' train
function) runs N batches, is numbered by its first batch, and the analysis says N batches per step. There
`profile_steps` is widened to whole calls, and to at least MIN_PROFILED_CALLS of them (the first and last
profiled step are not counted, as XProf counts): a window of 11 batches holds only 3 calls of 4 batches,
one of them counted. The widened window is logged and named in the printed line.
Each fit is its own run: its batches are numbered from 1 and its window profiled again; LOG_DIR holds
the latest fit, and an earlier run's files there (the monitor's last fit, or an earlier program's) move
to LOG_DIR/fit-K/, so each capture stays beside its own run's files. A file in LOG_DIR that stallscope did
not write (a steps.csv of the user's) is refused, never replaced. Without a log_dir the fit's files go to
a temporary folder that is removed when the fit ends: `analysis` keeps the figures, and its paths say the
profile was not kept.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import keras

from stallscope.config import require_folder_to_write
from stallscope.errors import UsageError
from stallscope.verdict import fmt_share, verdict_phrase
from stallscope.workload import rundir
from stallscope.workload.fit_loop import steps_per_execution
from stallscope.workload.marking import batch_size_of, dataset_or_none, window_of, write_chains
from stallscope.workload.profiling import ProfileWindow, StepProfiler
from stallscope.workload.resources import ResourceMonitor, minor_faults

log = logging.getLogger(__name__)

PROFILE_SUBDIR = rundir.MONITOR_PROFILE_DIR
FIT_FILES = (rundir.STEPS_NAME, rundir.RESOURCES_NAME, rundir.PIPELINE_NAME, PROFILE_SUBDIR)
TEMP_PREFIX = "stallscope-monitor-"
NOT_KEPT = "(not kept: StallMonitor without log_dir)"   # the Analysis' paths once its temporary folder is gone

# Keras 3 calls no callback when fit raises, so a monitor whose fit failed inside its window would
# leave TF's profiler running and the next fit unable to profile: the next monitor closes it.
_unfinished: "StallMonitor | None" = None


class StallMonitor(keras.callbacks.Callback):
    """Marks, times and profiles training steps; analyses the window when training ends.

    profile_steps: (start, stop) batches of each fit, 1-based and inclusive, counted across epochs, or
    None for timing only. Under steps_per_execution=N a step runs N batches: the window is widened to
    whole calls, at least MIN_PROFILED_CALLS of them, and the printed line names the batches profiled.
    log_dir: where steps.csv and profile/plugins/profile/<capture>/ go; None: a temporary folder, removed
    when the fit ends (`analysis` keeps its figures; its profile_path and run_dir say it was not kept).
    Reused for another fit, the monitor starts a new run: the earlier run's files move to the first free
    LOG_DIR/fit-K/ (K = 1, 2, ...), and `analysis` is of the latest fit (None until its window has run).
    verbose: print the one-line diagnosis when training ends (as Keras' own callbacks print); it is logged either way.
    dataset: the tf.data.Dataset the fit reads, if you pass it: its stages as written and as TF runs them go to
    LOG_DIR/pipeline.json, so the analysis names TF's rewrites (a callback cannot see the fit's dataset), and
    its batch size counts steps.csv's images (left empty without it: Keras does not tell a callback).
    """

    def __init__(self, profile_steps: tuple[int, int] | None = (10, 20), log_dir: Path | str | None = None,
                 verbose: bool = True, dataset=None) -> None:
        super().__init__()
        self.dataset = dataset_or_none(dataset, "StallMonitor dataset")
        self.verbose = verbose
        self.window = window_of(profile_steps, name="StallMonitor profile_steps")
        self.log_dir = require_folder_to_write("StallMonitor log_dir", log_dir) if log_dir is not None else None
        self.keep = log_dir is not None   # a log_dir given is the user's to keep; a temporary one is removed
        if self.log_dir is not None:
            _refuse_foreign(self.log_dir)
        self._batch_size = batch_size_of(self.dataset)
        self.fit_window: ProfileWindow | None = self.window   # the window in whole calls (steps_per_execution)
        self.analysis = None
        self.records: list[rundir.StepRecord] = []
        self.fits = 0                 # fits begun with this monitor
        self._profiler: StepProfiler | None = None
        self._marker = None
        self._batches = 0             # batches this fit has run
        self._per_step = 1            # batches per step (steps_per_execution)
        self._step = 0                # the running step's number: its first batch
        self._started = 0.0
        self._step_started = 0.0
        self._faults_started: int | None = None
        self._resources: ResourceMonitor | None = None

    def on_train_begin(self, logs=None) -> None:
        global _unfinished
        _close_unfinished()
        self._begin_fit()
        _unfinished = self
        log.info("stallscope: step times and profile go to %s", self.log_dir)
        self._profiler = StepProfiler(self.fit_window, self.log_dir / PROFILE_SUBDIR, owner="StallMonitor profile_steps")
        self._resources = ResourceMonitor().__enter__()
        self._started = time.perf_counter()

    def _begin_fit(self) -> None:
        """A new run: an earlier run's files in LOG_DIR (this monitor's last fit, or an earlier program's)
        kept aside, counters and analysis reset; a file of the user's there refused, never replaced."""
        self.fits += 1
        if not self.keep:
            self.log_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        else:
            _refuse_foreign(self.log_dir)
            _keep_earlier_run(self.log_dir)
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"StallMonitor log_dir: {str(self.log_dir)!r} cannot be made ({exc.strerror or exc})") from None
        self.analysis = None
        self.records = []
        self._batches = 0
        self._per_step = steps_per_execution(self.model)
        self.fit_window = in_whole_calls(self.window, self._per_step)
        if self.fit_window != self.window:
            log.info("stallscope: profile_steps %s widened to batches %s: %d whole calls of %d batches "
                     "(steps_per_execution=%d)", self.window.text, self.fit_window.text,
                     _calls(self.fit_window, self._per_step), self._per_step, self._per_step)

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self._step = self._batches + 1
        self._marker = self._profiler.step(self._step, batches=self._per_step)
        self._marker.__enter__()
        self._step_started = time.perf_counter()
        self._faults_started = minor_faults()

    def on_train_batch_end(self, batch, logs=None) -> None:
        done = time.perf_counter()
        faults = minor_faults()
        self._marker.__exit__(None, None, None)
        self._marker = None
        self._batches += self._per_step
        self.records.append(rundir.StepRecord(
            step=self._step, phase="train", started_s=round(self._step_started - self._started, 6),
            step_ms=(done - self._step_started) * 1000.0, input_wait_ms=math.nan, compute_ms=math.nan,
            images=_images(logs, self._batch_size, self._per_step), warmup=self._step == 1,
            minor_faults=None if faults is None or self._faults_started is None else faults - self._faults_started,
        ))

    def on_train_end(self, logs=None) -> None:
        global _unfinished
        _unfinished = None
        self._profiler.stop()
        try:
            self._write_run_files()
            if self._profiler.captured_steps == 0:
                if self.window is not None:
                    log.warning("stallscope: the fit ended after %d batch(es), before batch %d of the window %s; "
                                "no profile was captured", self._batches, self.fit_window.start, self.fit_window.text)
                return
            self.analysis = self._analyze()
        finally:
            self._remove_temporary()
        line = summary_line(self.analysis)
        if self.fit_window != self.window:
            line += (f"; profiled batches {self.fit_window.text} ({_calls(self.fit_window, self._per_step)} whole "
                     f"calls; profile_steps {self.window.text} held fewer)")
        log.info("stallscope: %s", line)
        if self.verbose:
            where = (f"profile under {self.log_dir / PROFILE_SUBDIR}" if self.keep
                     else "profile not kept: give log_dir= to keep it")
            print(f"stallscope: {line} ({where})")

    def _remove_temporary(self) -> None:
        """The fit's temporary folder (no log_dir given) removed: nothing the user did not ask for is left
        behind; the analysis' paths then say the profile was not kept."""
        if self.keep or self.log_dir is None:
            return
        shutil.rmtree(self.log_dir, ignore_errors=True)
        if self.analysis is not None:
            self.analysis = dataclasses.replace(self.analysis, profile_path=NOT_KEPT, run_dir=None, source=NOT_KEPT,
                                                captures=())

    def _analyze(self):
        """This fit's own capture (not the newest under LOG_DIR), with its batches per step."""
        from stallscope.analysis.analyze import analyze_run

        capture = self._profiler.capture  # by its path: an earlier fit's, in LOG_DIR/fit-K/, may share its name
        analysis = analyze_run(self.log_dir, capture=str(capture.relative_to(self.log_dir)) if capture else None)
        if analysis.steps.batches_per_step != self._per_step:  # one step marked: no stride to tell it from
            steps = dataclasses.replace(analysis.steps, batches_per_step=self._per_step)
            analysis = dataclasses.replace(analysis, steps=steps)
        return analysis

    def _close_after_failed_fit(self) -> None:
        """Saves what a fit that raised left behind: its partial profile and the steps it timed."""
        if self._marker is not None:
            self._marker.__exit__(None, None, None)   # the step the error cut short
            self._marker = None
        if self._profiler is not None and self._profiler.active:
            self._profiler.stop()
            kept = f"is under {self.log_dir / PROFILE_SUBDIR}" if self.keep else "was not kept (no log_dir)"
            log.warning("stallscope: an earlier fit stopped inside its profile window %s; its partial profile "
                        "(%d step(s)) %s", self.fit_window.text, self._profiler.captured_steps, kept)
        if not self.keep:
            self._remove_temporary()
            self._resources, resources = None, self._resources
            if resources is not None:
                resources.__exit__(None, None, None)
            return
        self._write_run_files()

    def _write_run_files(self) -> None:
        resources, self._resources = self._resources, None
        if resources is not None:
            resources.__exit__(None, None, None)   # first: its sampling thread ends even if a write fails
        rundir.write_steps(self.log_dir, self.records)
        write_chains(self.log_dir, self.dataset)
        if resources is not None:
            rundir.write_json(self.log_dir, rundir.RESOURCES_NAME, resources.report.to_dict())


def _close_unfinished() -> None:
    """Closes what an earlier fit that raised left open. Saving its files may fail too (its folder gone,
    say): that is logged, never raised into the fit that is starting."""
    global _unfinished
    earlier, _unfinished = _unfinished, None
    if earlier is None:
        return
    try:
        earlier._close_after_failed_fit()
    except Exception as exc:  # anything: the new fit must run whatever the old one left behind
        log.warning("stallscope: could not save what an earlier failed fit left in %s (%s: %s)",
                    earlier.log_dir, type(exc).__name__, exc)


def _refuse_foreign(log_dir: Path) -> None:
    """A UsageError naming the file in LOG_DIR that a fit would replace and stallscope did not write."""
    foreign = rundir.foreign_file(log_dir)
    if foreign is not None:
        raise UsageError(f"StallMonitor log_dir: {str(foreign)!r} is not written by stallscope and a fit would "
                         "replace it; give a log_dir of stallscope's own or move the file")


def _keep_earlier_run(log_dir: Path) -> None:
    """Moves an earlier run's files from LOG_DIR to the first free LOG_DIR/fit-K/ (K = 1, 2, ...), so this
    fit overwrites none of them and each capture stays beside its own run's files; where they cannot be
    moved the fit is refused rather than let overwrite them."""
    present = [name for name in FIT_FILES if (log_dir / name).exists()]
    if not present:
        return
    number = 1
    while (log_dir / f"fit-{number}").exists():
        number += 1
    target = log_dir / f"fit-{number}"
    try:
        target.mkdir()
        for name in present:
            os.replace(log_dir / name, target / name)
    except OSError as exc:
        raise UsageError(f"StallMonitor log_dir: the earlier run's files in {str(log_dir)!r} cannot be moved to "
                         f"{str(target)!r} ({exc.strerror or exc}); this fit would overwrite them") from None
    log.info("stallscope: the earlier run's files moved to %s", target)


def summary_line(analysis) -> str:
    """Verdict, input share, bottleneck stage and the most helpful fix, in one line; a step of several
    batches (steps_per_execution) says so, with the time per batch; a verdict from too few counted steps
    says so in the same line (its warning), not only in `analyze`'s report."""
    fix = analysis.advice[0].title if analysis.advice else "none"
    verdict = verdict_phrase(analysis.verdict)
    if analysis.input_share is not None:
        verdict += f" ({fmt_share(analysis.input_share)} of step time waits for input)"
    per_step = analysis.steps.batches_per_step
    batches = (f"; each step runs {per_step} batches, {analysis.steps.step_ms.mean / per_step:.1f} ms per batch"
               if per_step > 1 else "")
    caution = "".join(f"; caution: {warning}" for warning in analysis.warnings)
    return f"{verdict}{batches}; bottleneck: {analysis.bottleneck or 'none found'}; top fix: {fix}{caution}"


def min_profiled_calls() -> int:
    """Marked steps a window needs for a verdict: FEW_STEPS counted, and the first and last not counted."""
    from stallscope.analysis.analyze import FEW_STEPS

    return FEW_STEPS + 2


def in_whole_calls(window: ProfileWindow | None, per_step: int) -> ProfileWindow | None:
    """Under steps_per_execution=N (calls of N batches, the first at batch 1): the window from the first
    batch of the call holding its start, over whole calls, and at least `min_profiled_calls()` of them;
    the window as given at N=1 or with no window."""
    if window is None or per_step <= 1:
        return window
    start = (window.start - 1) // per_step * per_step + 1
    calls = max(math.ceil((window.stop - start + 1) / per_step), min_profiled_calls())
    return ProfileWindow(start, start + calls * per_step - 1)


def _calls(window: ProfileWindow, per_step: int) -> int:
    return (window.stop - window.start + 1) // per_step


def _images(logs, batch_size: int | None, per_step: int) -> int | None:
    """The step's images: Keras' own count where its logs give one (`size`), else the dataset's batch
    size times the step's batches; None (an empty cell) where neither is known: Keras does not pass the
    batch size to batch callbacks."""
    size = (logs or {}).get("size")
    if isinstance(size, (int, float)) and size > 0:
        return int(size) * per_step
    return batch_size * per_step if batch_size else None
