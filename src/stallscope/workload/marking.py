"""Step markers and a profiled window for the user's own training program.

The built-in workload's `StepProfiler` already starts the profiler at a window's first step and
stops it after its last; this module keeps one such profiler per process so that a user's loop needs
only `with stallscope.step(i):` around each step, and adds the step marker outside a profiled window
too (a `Trace` costs next to nothing while no profiler runs), so any profile a user takes later,
with TensorBoard or `stallscope capture`, has steps xprof and `analyze` can find.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from pathlib import Path

from stallscope.config import require_folder_to_write
from stallscope.errors import StallscopeError, UsageError
from stallscope.service.guard import EVERY_INTERFACE, PortGuard
from stallscope.service.servers import require_host
from stallscope.workload import rundir
from stallscope.workload.profiling import STEP_TRACE_NAME, ProfileWindow, StepProfiler
from stallscope.workload.resources import ResourceMonitor

log = logging.getLogger(__name__)

_active: StepProfiler | None = None
_profiler_guards: dict[int, PortGuard] = {}


def window_of(steps: tuple[int, int] | None, *, name: str = "steps") -> ProfileWindow | None:
    """(start, stop), 1-based inclusive, as a ProfileWindow; None profiles nothing."""
    if steps is None:
        return None
    try:
        start, stop = (int(v) for v in steps)
    except (TypeError, ValueError):
        raise UsageError(f"{name}: expected (START, STOP) such as (10, 20), got {steps!r}") from None
    return ProfileWindow(start, stop)


@contextlib.contextmanager
def step(number: int):
    """Marks one training step (number is 1-based); profiled when inside an active `profile` window."""
    import tensorflow as tf

    if tf.inside_function():  # a marker traced into a graph would mark the tracing, not each step
        raise UsageError("stallscope.step: used inside a tf.function; put `with stallscope.step(i):` around "
                         "the call of the tf.function, not inside it")
    if _active is not None:
        with _active.step(int(number)):
            yield
        return
    with tf.profiler.experimental.Trace(STEP_TRACE_NAME, step_num=int(number), _r=1):
        yield


class Profile:
    """A window of `step(i)`s to capture; the profile lands under LOG_DIR/plugins/profile/<capture>/ and
    the CPU the block used (and how often a container's CPU quota ran out) in LOG_DIR/resources.json,
    which `analyze` reads with the profile. The capture folder keeps its own copy of resources.json (and
    pipeline.json), so a later window into the same LOG_DIR leaves this window's analysis its own."""

    def __init__(self, log_dir: Path | str, steps: tuple[int, int] = (10, 20), dataset=None) -> None:
        self.log_dir = require_folder_to_write("stallscope.profile log_dir", log_dir)
        foreign = rundir.foreign_file(self.log_dir, (rundir.RESOURCES_NAME, rundir.PIPELINE_NAME))
        if foreign is not None:  # the window writes both into LOG_DIR: a file of the user's is never replaced
            raise UsageError(f"stallscope.profile log_dir: {str(foreign)!r} is not written by stallscope and the "
                             "window would replace it; give a log_dir of stallscope's own or move the file")
        self.dataset = dataset_or_none(dataset, "stallscope.profile dataset")
        window = window_of(steps, name="stallscope.profile steps")
        if window is None:
            raise UsageError("stallscope.profile steps: expected (START, STOP) such as (10, 20), got None")
        self.profiler = StepProfiler(window, self.log_dir, owner="stallscope.profile")
        self._resources: ResourceMonitor | None = None

    def __enter__(self) -> "Profile":
        global _active
        if _active is not None:
            raise UsageError("stallscope.profile: another stallscope.profile window is already open in this process")
        _active = self.profiler
        self._resources = ResourceMonitor().__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        global _active
        _active = None
        self.profiler.stop()
        self._resources.__exit__(*exc_info)
        for folder in (self.log_dir, self.profiler.capture):
            if folder is None:
                continue
            try:
                folder.mkdir(parents=True, exist_ok=True)
                rundir.write_json(folder, rundir.RESOURCES_NAME, self._resources.report.to_dict())
                write_chains(folder, self.dataset)
            except OSError as exc:  # the profile is the result; its CPU figures are not worth the user's error
                log.warning("stallscope.profile: could not write %s (%s)", folder / rundir.RESOURCES_NAME, exc)

    @property
    def captured_steps(self) -> int:
        return self.profiler.captured_steps


def dataset_or_none(dataset, name: str):
    """`dataset` where it is a tf.data.Dataset or None; else a one-line UsageError naming the argument."""
    if dataset is None:
        return None
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise UsageError(f"{name}: expected a tf.data.Dataset, got {type(dataset).__name__}")
    return dataset


# Stages that make one element of each element they take: the batch below them is the batch fit receives.
_ONE_FOR_ONE = frozenset({"_MapDataset", "_ParallelMapDataset", "_PrefetchDataset", "_OptionsDataset",
                          "_ShuffleDataset", "CacheDataset", "_CacheDataset", "_RepeatDataset", "_TakeDataset",
                          "_SkipDataset", "_AssertCardinalityDataset", "_ModelDataset", "_OptimizeDataset"})
_BATCHES = frozenset({"_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset"})


def batch_size_of(dataset) -> int | None:
    """The examples in one batch of `dataset`: its element's first dimension where TF knows it, else the
    batch stage's size under stages that keep one element per element (a map, prefetch, repeat, ...);
    None where neither says (no dataset, an unbatch, a filter or a generator in the way)."""
    if dataset is None:
        return None
    import tensorflow as tf

    try:
        first = tf.nest.flatten(dataset.element_spec)[0]
        known = first.shape[0] if first.shape.rank else None
    except (AttributeError, IndexError, TypeError, ValueError):
        known = None
    if known is not None:
        return int(known)
    stage = dataset
    while stage is not None:
        name = type(stage).__name__
        if name in _BATCHES:
            try:
                size = int(stage._batch_size)  # noqa: SLF001  (a constant tensor of the stage)
            except (AttributeError, TypeError, ValueError):
                return None
            return size if size > 0 else None
        if name not in _ONE_FOR_ONE:
            return None
        stage = getattr(stage, "_input_dataset", None)
    return None


def write_chains(log_dir: Path, dataset) -> None:
    """LOG_DIR/pipeline.json with the dataset's stages as written and as TF runs them, where a dataset
    was given and its graph can be read, so `analyze` names TF's rewrites of it."""
    if dataset is None:
        return
    from stallscope.pipeline.describe import chains_of

    chains = chains_of(dataset)
    if chains is not None:
        rundir.write_json(log_dir, rundir.PIPELINE_NAME, chains)


def serve_profiler(port: int, host: str = "127.0.0.1") -> int:
    """Starts TF's profiler server on `port` so `stallscope capture HOST:PORT` can attach; returns the port.

    TF's own server aborts the process or fails silently when the port is taken, so the port is
    checked first and a taken port ends in one line. TF's server listens on every interface, with no
    authentication (whoever reaches it can trace this job); so the port is held at this machine's other
    addresses, as `stallscope serve` does, and only `host` (default: this machine) can capture.
    host="0.0.0.0" opens it to every machine that can reach this one.
    """
    if not isinstance(port, int) or not 0 < port < 65536:
        raise UsageError(f"serve_profiler: port must be an integer in 1..65535, got {port!r}")
    host = require_host(host, "serve_profiler host")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError as exc:
            raise UsageError(f"serve_profiler: port {port} cannot be bound ({exc.strerror or exc})") from None
    import tensorflow as tf

    try:
        tf.profiler.experimental.server.start(port)
    except Exception as exc:  # TF raises its own error types here
        raise StallscopeError(f"serve_profiler: the profiler server did not start on port {port} ({exc})") from None
    if host not in EVERY_INTERFACE:
        _profiler_guards[port] = PortGuard(port, host=host).start()  # TF's server lives as long as the process
    log.info("TF profiler server listening on port %d; capture with `stallscope capture localhost:%d`", port, port)
    return port
