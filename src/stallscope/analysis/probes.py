"""The short probes of a differential diagnosis, each a real run of one part of the workload.

- pipeline probe: the input pipeline alone, as fast as it goes, with the data set's files in the
  page cache (warm) or evicted from it (cold). It counts the elements that went through the decode
  map (a counter after it), so a shuffle buffer filling before the first batch is measured as work
  done, not as a slow first batch; it also takes the process's CPU seconds and I/O counters.
- compute probe: the training loop fed from a few batches already in memory (taken, cached,
  repeated), so every step is the model (or the emulated device) alone.
- end-to-end probe: the training loop fed by the pipeline, as `stallscope train` runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from stallscope.analysis import iostats
from stallscope.config import AUTOTUNE
from stallscope.errors import UsageError
from stallscope.pipeline.config import PipelineConfig
from stallscope.pipeline.sources import DataSource
from stallscope.workload.fit_loop import StepFn, epochs
from stallscope.workload.resources import ResourceMonitor, minor_faults
from stallscope.workload.rundir import StepRecord
from stallscope.workload.timing import summarize_steps

logger = logging.getLogger(__name__)

CACHE_STATES = ("warm", "cold")
WARM_BYTES_LIMIT = 2 * 1024**3   # read the files into the page cache up front only below this size
MINCORE_FILES_LIMIT = 20_000     # mincore one file at a time: skip the check for huge file lists
_MONITOR_INTERVAL_S = 0.25


@dataclasses.dataclass(frozen=True)
class PipelineProbe:
    """The pipeline alone: throughput, CPU and I/O of `images` elements decoded in `seconds`.

    cached_before: share of the source's pages in the page cache when the probe started (mincore),
        None where it cannot be measured.
    cpu_seconds: this process's CPU time during the probe (all threads).
    run_queue_seconds: time its threads were runnable but had no core (contention); None: unknown.
    cores: the CPU the process may use, in cores (its affinity under its cgroup's quota; cpu_limits).
    other_cores_busy: mean cores of that which other processes kept busy meanwhile (contention).
    cpus: the CPUs it may be scheduled on, which size tf.data's shared pool (None: `cores`).
    """

    cache_state: str
    batches: int
    images: int
    seconds: float
    cpu_seconds: float
    run_queue_seconds: float | None
    cores: float
    other_cores_busy: float
    cached_before: float | None
    io: dict[str, int] | None
    io_per_image: iostats.IoPerImage | None
    batch_size: int
    # After the first batch: the pipeline's steady pace, without building the iterator and filling
    # buffers (a short probe's start can be a third of its time). None with fewer than two batches.
    steady_seconds: float | None = None
    steady_images: int | None = None
    cpus: int | None = None
    throttled_share: float | None = None  # periods in which the cgroup's CPU quota ran out; None: no quota

    @property
    def ms_per_image(self) -> float:
        return self.seconds * 1000.0 / self.images if self.images else math.inf

    @property
    def steady_ms_per_image(self) -> float | None:
        if not self.steady_images or self.steady_seconds is None:
            return None
        return self.steady_seconds * 1000.0 / self.steady_images

    @property
    def ms_per_batch(self) -> float:
        return self.ms_per_image * self.batch_size

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else math.inf

    @property
    def cpu_ms_per_image(self) -> float:
        return self.cpu_seconds * 1000.0 / self.images if self.images else 0.0

    @property
    def cpu_demand_ms_per_image(self) -> float:
        """CPU time per image plus the time its threads waited for a core."""
        return (self.cpu_seconds + (self.run_queue_seconds or 0.0)) * 1000.0 / self.images if self.images else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["io_per_image"] = self.io_per_image.to_dict() if self.io_per_image else None
        data.update(ms_per_image=self.ms_per_image, ms_per_batch=self.ms_per_batch,
                    images_per_second=self.images_per_second, cpu_ms_per_image=self.cpu_ms_per_image,
                    cpu_demand_ms_per_image=self.cpu_demand_ms_per_image,
                    steady_ms_per_image=self.steady_ms_per_image)
        return data


def run_queue_delay_s() -> float | None:
    """Seconds this process's live threads spent runnable but waiting for a core (Linux schedstat).

    Time a pipeline thread waits for a core that other processes hold is CPU work delayed, not a
    fetch stall; without this, a busy machine would look like slow storage. None where the kernel
    keeps no schedstat."""
    total = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    found = False
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as handle:
                fields = handle.read().split()
        except OSError:
            continue  # the thread ended meanwhile
        if len(fields) >= 2:
            total += int(fields[1])
            found = True
    return total / 1e9 if found else None


def pipeline_threads(config: PipelineConfig, cores: float) -> float:
    """How many cores the pipeline's stages can keep busy: one for a sequential chain (it runs
    inside get_next), the parallelism of its parallel stages otherwise, at most the pool size."""
    widths = [1]
    for knob in (config.map_parallelism, config.read_parallelism):
        if knob is not None:
            widths.append(cores if knob == AUTOTUNE else min(knob, cores))
    threads = max(widths)
    if config.private_threadpool_size:
        threads = min(threads, config.private_threadpool_size)
    return float(max(1, min(threads, cores)))


def _counting_hooks(extra_stages: Mapping[str, Any] | None, counter):
    """The caller's hooks plus a counter of the elements leaving the decode map."""
    hooks = dict(extra_stages or {})
    inner = hooks.get("after_decode")

    def count(dataset):
        dataset = inner(dataset) if inner is not None else dataset

        def tally(*element):
            counter.assign_add(1)
            return element if len(element) > 1 else element[0]

        return dataset.map(tally, name="stallscope_probe_counter")

    hooks["after_decode"] = count
    return hooks


def probe_pipeline(
    config: PipelineConfig,
    source: DataSource,
    *,
    cache_state: str,
    max_images: int,
    budget_s: float,
    extra_stages: Mapping[str, Any] | None = None,
    min_s: float = 0.0,
) -> PipelineProbe:
    """Runs the pipeline alone until `max_images` went through decode and `min_s` passed (more
    passes: a steady pace past the first batch), or `budget_s` passed (checked between batches; a
    shuffle buffer larger than max_images is filled in full)."""
    from stallscope.tfimport import import_tensorflow

    tf = import_tensorflow()
    from stallscope.pipeline.builder import build_dataset

    if cache_state not in CACHE_STATES:
        raise UsageError(f"cache_state: expected one of {', '.join(CACHE_STATES)}, got {cache_state!r}")
    if max_images <= 0:
        raise UsageError(f"max_images: expected a positive integer, got {max_images!r}")
    from stallscope.pipeline.input_errors import data_errors, input_error, store_error, store_errors

    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
    dataset = build_dataset(config, source, repeat=True, extra_stages=_counting_hooks(extra_stages, counter))
    try:
        return _timed_probe(
            dataset, lambda batch: _so_far(int(counter.numpy()), max_images), cache_state=cache_state,
            files=[str(p) for p in source.files], budget_s=budget_s, batch_size=config.batch_size,
            source_kind=source.kind, examples=source.num_examples, min_s=min_s)
    except data_errors() as exc:  # a damaged image or record: the one line `train` prints, naming it
        raise input_error(source, exc) from None
    except store_errors() as exc:
        raise store_error(source, exc) from None


@dataclasses.dataclass(frozen=True)
class ReadChain:
    """The data set's records read by one stream alone, no decode: wall time and this process's CPU
    per record. Where the data is in a store or on a network file system, this is the chain a
    sequential reader puts in front of a parallel decode, which the client's own costs and the
    store's serving make longer than any model of its requests says (benchmarks/advice.py: records
    on the emulated gs:// at 10 ms read at 1.22 ms a record, 0.66 of it CPU, where the requests
    alone model 0.4 ms)."""

    records: int
    seconds: float
    cpu_seconds: float

    @property
    def ms_per_image(self) -> float:
        return self.seconds * 1000.0 / self.records if self.records else math.inf

    @property
    def cpu_ms_per_image(self) -> float:
        return self.cpu_seconds * 1000.0 / self.records if self.records else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ms_per_image": self.ms_per_image,
                "cpu_ms_per_image": self.cpu_ms_per_image}


def probe_record_reads(config: PipelineConfig, source: DataSource, *, budget_s: float,
                       max_records: int) -> ReadChain:
    """Reads `source`'s records by one stream (after its first record, which opens the first shard)
    until `max_records` or `budget_s`, timing the wall clock and this process's CPU."""
    from stallscope.pipeline.builder import build_record_reads

    return time_record_reads(build_record_reads(config, source), budget_s=budget_s, max_records=max_records)


def time_record_reads(records, *, budget_s: float, max_records: int) -> ReadChain:
    """Times a dataset of serialized records read by one stream (repeated), after its first record."""
    iterator = iter(records)
    next(iterator)
    records = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while records < max_records and time.perf_counter() - started < budget_s:
        next(iterator)
        records += 1
    chain = ReadChain(records=records, seconds=time.perf_counter() - started,
                      cpu_seconds=time.process_time() - cpu_started)
    del iterator
    logger.info("records read alone: %d in %.2f s (%.2f ms each, %.2f CPU ms)", records, chain.seconds,
                chain.ms_per_image, chain.cpu_ms_per_image)
    return chain


def _so_far(images: int, wanted: int) -> tuple[int, bool]:
    return images, images >= wanted


def probe_dataset(dataset, *, cache_state: str, files: Sequence[str], max_batches: int,
                  budget_s: float) -> PipelineProbe:
    """The user's own `tf.data.Dataset` alone, as fast as it goes, for `max_batches` batches or
    `budget_s`, epoch after epoch from a new iterator each as `fit` runs it (a `repeat` would add the
    prefetch TF injects above it); images are counted by each batch's leading dimension. `files` are
    the dataset's files where known (evicted for a cold probe, read once for a warm one)."""
    if cache_state not in CACHE_STATES:
        raise UsageError(f"cache_state: expected one of {', '.join(CACHE_STATES)}, got {cache_state!r}")
    if cache_state == "cold" and not files:
        raise UsageError("cache_state: a cold probe needs the dataset's files, and none are known")
    if max_batches <= 0:
        raise UsageError(f"max_batches: expected a positive integer, got {max_batches!r}")
    produced = {"images": 0, "batches": 0}

    def tally(batch) -> tuple[int, bool]:
        produced["images"] += batch_images(batch)
        produced["batches"] += 1
        return produced["images"], produced["batches"] >= max_batches

    probe = _timed_probe(epochs(dataset), tally, cache_state=cache_state, files=list(files), budget_s=budget_s,
                         batch_size=0, source_kind="records", examples=0)
    batches = produced["batches"]
    return dataclasses.replace(probe, batch_size=round(produced["images"] / batches) if batches else 0)


def batch_images(batch) -> int:
    """Elements in a batch: the leading dimension of its first component (1 for an unbatched element)."""
    import tensorflow as tf

    first = tf.nest.flatten(batch)[0]
    return int(first.shape[0]) if first.shape.rank else 1


def _timed_probe(dataset, tally, *, cache_state: str, files: list[str], budget_s: float, batch_size: int,
                 source_kind: str, examples: int, min_s: float = 0.0) -> PipelineProbe:
    """Iterates `dataset` with the page cache in `cache_state` until `tally(batch)` -> (images so far,
    enough) says enough and min_s passed, or budget_s passed; measures time, CPU, run-queue delay and
    I/O meanwhile."""
    from stallscope.storage.location import is_remote

    local = [f for f in files if not is_remote(str(f))]  # the page cache holds local files only
    if cache_state == "cold":
        iostats.evict_from_page_cache(local)
    elif local and _total_bytes(local) <= WARM_BYTES_LIMIT:
        iostats.warm_page_cache(local)
    cached = iostats.cached_fraction(local) if local and len(local) <= MINCORE_FILES_LIMIT else None
    batches = images = 0
    first_at, first_images = 0.0, 0
    delay_before = run_queue_delay_s()
    with ResourceMonitor(interval_s=_MONITOR_INTERVAL_S) as monitor:
        started = time.perf_counter()
        iterator = iter(dataset)
        while True:
            batch = next(iterator)
            batches += 1
            images, enough = tally(batch)
            if batches == 1:
                first_at, first_images = time.perf_counter(), images
            elapsed = time.perf_counter() - started
            if (enough and elapsed >= min_s) or elapsed >= budget_s:
                break
        ended = time.perf_counter()
        seconds = ended - started
        delay_after = run_queue_delay_s()
    del iterator
    run_queue = None if delay_before is None or delay_after is None else max(0.0, delay_after - delay_before)
    report = monitor.report
    summary = report.summary()
    cores = report.cores
    machine, own = summary["system_mean_percent"], summary["process_mean_percent"]
    other = max(0.0, machine / 100.0 * cores - own / 100.0) if machine is not None and own is not None else 0.0
    probe = PipelineProbe(
        cache_state=cache_state, batches=batches, images=images, seconds=seconds,
        cpu_seconds=report.process_cpu_seconds, run_queue_seconds=run_queue, cores=cores, other_cores_busy=other,
        cpus=len(report.limits.cpus),
        throttled_share=report.throttling.throttled_share if report.throttling else None,
        cached_before=cached, io=report.io,
        io_per_image=iostats.per_image(report.io, images, source_kind=source_kind,
                                       files_in_source=len(files), examples=examples),
        batch_size=batch_size,
        steady_seconds=ended - first_at if batches > 1 else None,
        steady_images=images - first_images if batches > 1 else None,
    )
    logger.info("%s pipeline probe: %d images in %.2f s (%.0f images/s, %.2f CPU ms/image, %.2f ms/image "
                "waiting for a core)", cache_state, images, seconds, probe.images_per_second,
                probe.cpu_ms_per_image, probe.cpu_demand_ms_per_image - probe.cpu_ms_per_image)
    return probe


def _total_bytes(files: list[str]) -> int:
    return sum(os.path.getsize(f) for f in files)


@dataclasses.dataclass(frozen=True)
class LoopProbe:
    """A run of the training loop: means over its measured steps (ms)."""

    kind: str            # "compute" (batches from memory) or "end_to_end"
    phase: str
    steps: int
    step_ms: float
    input_wait_ms: float
    compute_ms: float
    images_per_second: float
    input_share: float
    verdict: str
    # How far apart the images/s of its measured steps' two halves are (0.05: 5%), the precision the
    # probe reached (workload/precision.py); None with too few steps to halve. too_short: they are
    # further apart than the tolerance a run is trusted at (the --precision asked for, where one was).
    halves_spread: float | None = None
    too_short: bool = False
    # With --precision: the tolerance asked for, and what ended the probe ("precision", "max_seconds").
    precision_target: float | None = None
    stopped_by: str | None = None

    @classmethod
    def from_steps(cls, kind: str, phase: str, steps: Sequence[StepRecord], *, target=None,
                   stopped_by: str | None = None) -> "LoopProbe":
        """`target`: the PrecisionTarget the probe ran to, if any."""
        from stallscope.workload.precision import DEFAULT_TOLERANCE, halves, spread_of

        stats = summarize_steps(steps)
        spread = spread_of(halves(steps))
        tolerance = target.tolerance if target is not None else DEFAULT_TOLERANCE
        too_short = spread is not None and spread > tolerance or (target is not None and spread is None)
        return cls(kind=kind, phase=phase, steps=stats.steps - stats.warmup_steps, step_ms=stats.step_time_ms,
                   input_wait_ms=stats.input_wait_ms, compute_ms=stats.compute_ms,
                   images_per_second=stats.images_per_second, input_share=stats.input_share, verdict=stats.verdict,
                   halves_spread=spread, too_short=too_short,
                   precision_target=target.tolerance if target is not None else None, stopped_by=stopped_by)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def probe_loop(kind: str, phase: str, dataset, take_step: StepFn, *, steps: int, warmup: int,
               profiler=None, batches_per_step: int = 1) -> LoopProbe:
    """A training loop over the user's own dataset as `fit` runs it: epoch after epoch, a new iterator
    each, `take_step(iterator)` one step (`fit_loop.model_steps`: the model's own train step on
    `batches_per_step` batches; `eager_steps`: an emulated device), which returns only when the step
    is done. Where TF knows the epoch's batches the next iterator is made between steps, as `fit`
    does; else the step that finds the epoch ended makes it and runs on. With a `StepProfiler`, each
    step runs inside its step marker, numbered by its first batch, so the profile can be analysed like
    any stallscope run (and says `batches_per_step`)."""
    records = []
    per_epoch = _batches_per_epoch(dataset)
    iterator, in_epoch, batches = iter(dataset), 0, 0
    run_started = time.perf_counter()
    for number in range(1, warmup + steps + 1):
        if per_epoch is not None and in_epoch >= per_epoch:
            iterator, in_epoch = iter(dataset), 0
        marker = profiler.step(batches + 1, batches=batches_per_step) if profiler is not None \
            else contextlib.nullcontext()
        with marker:
            started, faults = time.perf_counter(), minor_faults()
            taken = take_step(iterator)
            if taken.batches == 0:  # the epoch ended: a new iterator, as fit makes one
                if in_epoch == 0:
                    raise UsageError("dataset: an epoch of it holds no batch; there is nothing to measure")
                iterator, in_epoch = iter(dataset), 0
                taken = take_step(iterator)
            done, faults_done = time.perf_counter(), minor_faults()
        first = batches + 1
        batches += taken.batches
        in_epoch += taken.batches
        step_ms, wait_ms = (done - started) * 1000.0, taken.wait_s * 1000.0
        records.append(StepRecord(
            step=first, phase=phase, started_s=round(started - run_started, 6), step_ms=step_ms,
            input_wait_ms=wait_ms, compute_ms=max(step_ms - wait_ms, 0.0), images=taken.images,
            warmup=number <= warmup,
            minor_faults=None if faults is None or faults_done is None else faults_done - faults))
    if profiler is not None:
        profiler.stop()
    return LoopProbe.from_steps(kind, phase, records)


def _batches_per_epoch(dataset) -> int | None:
    """The dataset's batches in one epoch where TF knows them (None: unknown or endless)."""
    cardinality = dataset.cardinality  # a method of a Dataset, a value of a distributed dataset
    count = int(cardinality() if callable(cardinality) else cardinality)
    return count if count > 0 else None
