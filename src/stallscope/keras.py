"""`StallMonitor`: a Keras callback that makes a `model.fit` analysable by stallscope.

Each training batch runs inside a step marker (`Trace('train', step_num=i, _r=1)`, opened in
`on_train_batch_begin` and closed in `on_train_batch_end`), the window `profile_steps` is profiled,
and at the end of training the profile is analysed and the verdict, bottleneck and top fix logged;
`monitor.analysis` holds the `Analysis`. Every step's wall time goes to LOG_DIR/steps.csv and the CPU
the fit used (and, in a container, how often its CPU quota ran out) to LOG_DIR/resources.json. A callback
sees only whole batches, so input wait and compute per step are left unmeasured there (NaN): the
split comes from the profile.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from pathlib import Path

import keras

from stallscope.workload import rundir
from stallscope.workload.marking import dataset_or_none, window_of, write_chains
from stallscope.workload.profiling import StepProfiler
from stallscope.workload.resources import ResourceMonitor, minor_faults

log = logging.getLogger(__name__)

PROFILE_SUBDIR = "profile"

# Keras 3 calls no callback when fit raises, so a monitor whose fit failed inside its window would
# leave TF's profiler running and the next fit unable to profile: the next monitor closes it.
_unfinished: "StallMonitor | None" = None


class StallMonitor(keras.callbacks.Callback):
    """Marks, times and profiles training steps; analyses the window when training ends.

    profile_steps: (start, stop) global training steps, 1-based and inclusive, or None for timing only.
    log_dir: where steps.csv and profile/plugins/profile/<capture>/ go; None makes a new temporary one.
    verbose: print the one-line diagnosis when training ends (as Keras' own callbacks print); it is logged either way.
    dataset: the tf.data.Dataset the fit reads, if you pass it: its stages as written and as TF runs them go to
    LOG_DIR/pipeline.json, so the analysis names TF's rewrites (a callback cannot see the fit's dataset).
    """

    def __init__(self, profile_steps: tuple[int, int] | None = (10, 20), log_dir: Path | str | None = None,
                 verbose: bool = True, dataset=None) -> None:
        super().__init__()
        self.dataset = dataset_or_none(dataset, "StallMonitor dataset")
        self.verbose = verbose
        self.window = window_of(profile_steps, name="StallMonitor profile_steps")
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.analysis = None
        self.records: list[rundir.StepRecord] = []
        self._profiler: StepProfiler | None = None
        self._marker = None
        self._step = 0
        self._started = 0.0
        self._step_started = 0.0
        self._faults_started: int | None = None
        self._resources: ResourceMonitor | None = None

    def on_train_begin(self, logs=None) -> None:
        global _unfinished
        if _unfinished is not None:
            _unfinished._close_after_failed_fit()
        _unfinished = self
        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="stallscope-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log.info("stallscope: step times and profile go to %s", self.log_dir)
        self._profiler = StepProfiler(self.window, self.log_dir / PROFILE_SUBDIR, owner="StallMonitor profile_steps")
        self._resources = ResourceMonitor().__enter__()
        self._started = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self._step += 1
        self._marker = self._profiler.step(self._step)
        self._marker.__enter__()
        self._step_started = time.perf_counter()
        self._faults_started = minor_faults()

    def on_train_batch_end(self, batch, logs=None) -> None:
        done = time.perf_counter()
        faults = minor_faults()
        self._marker.__exit__(None, None, None)
        self._marker = None
        self.records.append(rundir.StepRecord(
            step=self._step, phase="train", started_s=round(self._step_started - self._started, 6),
            step_ms=(done - self._step_started) * 1000.0, input_wait_ms=math.nan, compute_ms=math.nan,
            images=_batch_size(logs), warmup=self._step == 1,
            minor_faults=None if faults is None or self._faults_started is None else faults - self._faults_started,
        ))

    def on_train_end(self, logs=None) -> None:
        global _unfinished
        _unfinished = None
        self._profiler.stop()
        self._write_run_files()
        if self._profiler.captured_steps == 0:
            if self.window is not None:
                log.warning("stallscope: training ended before step %d; no profile was captured", self.window.start)
            return
        from stallscope.analysis.analyze import analyze_run

        self.analysis = analyze_run(self.log_dir)  # the run directory: its steps.csv and resources.json too
        line = summary_line(self.analysis)
        log.info("stallscope: %s", line)
        if self.verbose:
            print(f"stallscope: {line} (profile under {self.log_dir / PROFILE_SUBDIR})")

    def _close_after_failed_fit(self) -> None:
        """Saves what a fit that raised left behind: its partial profile and the steps it timed."""
        if self._marker is not None:
            self._marker.__exit__(None, None, None)   # the step the error cut short
            self._marker = None
        if self._profiler is not None and self._profiler.active:
            self._profiler.stop()
            log.warning("stallscope: an earlier fit stopped inside its profile window %s; its partial profile "
                        "(%d step(s)) is under %s", self.window.text, self._profiler.captured_steps,
                        self.log_dir / PROFILE_SUBDIR)
        self._write_run_files()

    def _write_run_files(self) -> None:
        rundir.write_steps(self.log_dir, self.records)
        write_chains(self.log_dir, self.dataset)
        if self._resources is not None:
            self._resources.__exit__(None, None, None)
            rundir.write_json(self.log_dir, rundir.RESOURCES_NAME, self._resources.report.to_dict())
            self._resources = None


def summary_line(analysis) -> str:
    """Verdict, input share, bottleneck stage and the most helpful fix, in one line."""
    fix = analysis.advice[0].title if analysis.advice else "none"
    return (f"{analysis.verdict} input-bound ({analysis.input_share:.0%} of step time waits for input); "
            f"bottleneck: {analysis.bottleneck or 'none found'}; top fix: {fix}")


def _batch_size(logs) -> int:
    """Keras does not pass the batch size to batch callbacks; 0 means unknown."""
    size = (logs or {}).get("size")
    return int(size) if isinstance(size, (int, float)) else 0
