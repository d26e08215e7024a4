"""Differential stall analysis: short probes of one workload separate the causes of input wait.

As DS-Analyzer does for PyTorch, the same workload (pipeline config, source, model or emulated
device) is run in parts (see `probes.py`):

1. compute alone: the training loop fed from batches already in memory;
2. the pipeline alone with a cold page cache (the source's files evicted first);
3. the pipeline alone with a warm page cache (the same elements, now cached);
4. end to end: the training loop fed by the pipeline, as `stallscope train` runs it.

Per step the end-to-end input wait is split by what the pipeline spends its time on: CPU work
(preprocessing stall: decode, resize, ...) or waiting while no core works for it (fetch stall:
storage reads, remote latency). The CPU share comes from the warm probe's process CPU time over
the cores its stages can use; storage reads add what the cold probe took beyond the warm one, as far
as it would show as wait. What-if figures (other device speeds, more cores, data cached) follow
from the same numbers (`whatif.py`); `fix` applies the advice and measures again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from stallscope.analysis import whatif
from stallscope.analysis.advice import (
    CACHE_MEMORY_FRACTION, ONE_INTRA_OP_THREAD, UNPREDICTED_FIXES, Advice, apply_advice, merge_advice, quota_pool,
    storage_advice,
)
from stallscope.analysis.probes import (LoopProbe, PipelineProbe, ReadChain, pipeline_threads, probe_pipeline,
                                        probe_record_reads)
from stallscope.analysis.service_advice import service_advice
from stallscope.analysis.service_sizing import ServiceAssumptions
from stallscope.analysis.service_sizing import decoded_image_bytes
from stallscope.analysis.storage_counters import (
    StorageCounters,
    StorageFigures,
    load_storage_counters,
    measured_pattern,
    reader_pattern,
    storage_figures,
)
from stallscope.analysis.storage_whatif import (
    IoPattern,
    StorageScenario,
    StorageWhatIf,
    Workload,
    as_read_file_system,
    as_read_row,
    as_read_scenario,
    client_for_path,
    client_named,
    obstore_client_for,
    pattern_for,
    storage_whatif,
    sustained_cpu_ms,
)
from stallscope.analysis.storage_whatif import predict_config as predict_storage_config
from stallscope.analysis.stored_images import SHRINK_FROM
from stallscope.config import AUTOTUNE, json_ready, require_choice
from stallscope.cpu_limits import cpus_worth, quota_limited
from stallscope.errors import UsageError
from stallscope.pipeline.config import PipelineConfig
from stallscope.storage import request_tally
from stallscope.storage.fuse_daemons import DaemonClock
from stallscope.storage.location import is_remote
from stallscope.storage.request_tally import RequestTally
from stallscope.storage.round_trips import TIMING_STEP, time_store
from stallscope.storage.under import FileRoundTrips, StorageUnder, storage_under, time_file_round_trips
from stallscope.verdict import verdict_for
from stallscope.workload.models import parse_fine_tune
from stallscope.workload.train import TrainOptions

if TYPE_CHECKING:
    from stallscope.pipeline.sources import DataSource

logger = logging.getLogger(__name__)

CAUSES = ("fetch", "preprocessing", "none")
STEADY_CACHE_CHOICES = ("auto", "warm", "cold")
FITS_IN_MEMORY_FRACTION = 0.5  # "auto": the data stays in the page cache below this share of free RAM
COMPUTE_CACHED_BATCHES = 2
CACHE_FRACTION_OF_MEMORY = CACHE_MEMORY_FRACTION
# The warm probe reads for at least this long (more passes of a small data set): one pass of 128 images
# came out in a single batch, leaving no steady pace to measure (the storage what-if then fell back on
# process CPU per image, which counts TF's spinning threads: seed records predicted at 0.6-0.7x).
MIN_STEADY_S = 0.5


@dataclasses.dataclass(frozen=True)
class DiagnoseOptions:
    """One diagnosis.

    train: the workload (source, path, pipeline, model, accelerator); its steps/log_path are ignored.
        Its `precision` (a PrecisionTarget, `--precision`) runs each end-to-end probe until its halves
        agree, at most its max_seconds, instead of a window of `probe_steps`.
    phases: fine-tuning phases diagnosed one by one, e.g. ("head", "full") for a job that freezes
        the base and later unfreezes it (a cheaper step can turn a job input-bound).
    probe_steps: measured steps of the compute and end-to-end probes (the end-to-end window rounded
        to whole epochs on small data sets and where a shuffle of decoded images refills at each
        epoch start: `measured_steps`).
    pipeline_budget_s: most seconds each pipeline-alone probe runs.
    cold_cache: run the cold-cache probe (evicts the source's files from the page cache).
    steady_cache: the page-cache state of a long run, which the verdict and cause are judged on:
        "warm" (the data stays cached after the first epoch), "cold" (every epoch reads storage)
        or "auto" (warm when the data set fits in half the free memory).
    work_dir: where the probe runs' directories go (kept); None: a temporary directory, removed.
    storage_scenarios: stores the storage what-if predicts for (and the storage advice weighs);
        empty: the presets are shown and no storage advice is given.
    storage_client: the object-store client the what-if models ("tf-gcs", "obstore-gcs", "s3fs",
        "obstore"); None: from the data set path (s3:// -> the s3:// reader that runs, else the gs://
        reader the pipeline's `gcs_reader` names).
    storage_counters: a store's counters file (`StorageCounters`), read around the pipeline probe:
        requests, connections and bytes per image are then measured, not modelled.
    extra_stages: builder hooks added to every probe's pipeline (library use: tests, experiments).
    service: the tf.data service's link and workers' cores where given (`--service-link`, ...), for its sizing.
    """

    train: TrainOptions
    phases: tuple[str, ...] = ()
    probe_steps: int = 20
    pipeline_budget_s: float = 10.0
    cold_cache: bool = True
    steady_cache: str = "auto"
    work_dir: Path | None = None
    storage_scenarios: tuple[StorageScenario, ...] = ()
    storage_client: str | None = None
    storage_counters: Path | None = None
    extra_stages: Mapping[str, Callable] | None = dataclasses.field(default=None, compare=False)
    service: ServiceAssumptions = ServiceAssumptions()

    def __post_init__(self) -> None:
        if not isinstance(self.train, TrainOptions):
            raise UsageError(f"train: expected TrainOptions, got {type(self.train).__name__}")
        phases = tuple(self.phases) or (self.train.fine_tune,)
        object.__setattr__(self, "phases", tuple(parse_fine_tune(p) for p in phases))
        if isinstance(self.probe_steps, bool) or not isinstance(self.probe_steps, int) or self.probe_steps < 2:
            raise UsageError(f"--probe-steps: expected an integer >= 2, got {self.probe_steps!r}")
        if not (isinstance(self.pipeline_budget_s, (int, float)) and self.pipeline_budget_s > 0):
            raise UsageError(f"pipeline_budget_s: expected a number above 0, got {self.pipeline_budget_s!r}")
        require_choice("steady_cache", self.steady_cache, STEADY_CACHE_CHOICES)
        if self.steady_cache == "cold" and not self.cold_cache:
            raise UsageError("steady_cache: 'cold' needs the cold-cache probe; cold_cache is off")
        if self.work_dir is not None:
            object.__setattr__(self, "work_dir", Path(self.work_dir))
        object.__setattr__(self, "storage_scenarios", tuple(self.storage_scenarios))
        if any(not isinstance(x, StorageScenario) for x in self.storage_scenarios):
            raise UsageError(f"storage_scenarios: expected StorageScenario values, got {self.storage_scenarios!r}")
        if self.storage_client is not None:
            client_named(self.storage_client)
        if self.storage_counters is not None:
            object.__setattr__(self, "storage_counters", Path(self.storage_counters))

    @property
    def pipeline(self) -> PipelineConfig:
        return self.train.pipeline


@dataclasses.dataclass(frozen=True)
class PipelineBreakdown:
    """Where the pipeline's time per batch goes (ms), from the pipeline-alone probes."""

    warm_ms: float             # per batch, files in the page cache
    cold_ms: float | None      # per batch, files evicted first (None: not probed)
    cpu_ms: float              # the part the CPU works or waits for a core (warm): preprocessing
    waiting_ms: float          # the part no core works for the pipeline (warm): latency, reads
    storage_ms: float          # what a cold cache adds: reads from the device
    threads: float             # cores the pipeline's stages can keep busy here
    cpu_ms_per_image: float    # CPU time per image (all threads), for the more-cores what-if

    @property
    def fetch_fraction(self) -> float:
        """The share of the warm pipeline's time that is not CPU work."""
        return self.waiting_ms / self.warm_ms if self.warm_ms > 0 else 0.0


def breakdown(warm: PipelineProbe, cold: PipelineProbe | None, config: PipelineConfig) -> PipelineBreakdown:
    """Splits the warm pipeline time into CPU work and waiting, and adds the cold cache's cost.

    The CPU part is the CPU time its threads used or waited for (run queue) over the cores its
    stages can use (a sequential chain: one), never more than the wall time; the rest is waiting
    with no core working or wanted: storage reads, remote latency, a slow source."""
    threads = pipeline_threads(config, warm.cores)
    batch = config.batch_size
    warm_ms = warm.ms_per_image * batch
    cpu_ms = min(warm_ms, warm.cpu_demand_ms_per_image / threads * batch)
    cold_ms = cold.ms_per_image * batch if cold is not None else None
    storage = max(0.0, cold_ms - warm_ms) if cold_ms is not None else 0.0
    return PipelineBreakdown(warm_ms=warm_ms, cold_ms=cold_ms, cpu_ms=cpu_ms, waiting_ms=warm_ms - cpu_ms,
                             storage_ms=storage, threads=threads, cpu_ms_per_image=warm.cpu_ms_per_image)


@dataclasses.dataclass(frozen=True)
class PhaseDiagnosis:
    """One fine-tuning phase: the step split into compute and stalls (ms), and what-if figures."""

    phase: str
    compute: LoopProbe
    end_to_end: LoopProbe
    overlapped: bool                 # the step time fits compute overlapping the pipeline
    compute_ms: float
    steady_cache: str                # "warm" or "cold": the state the figures below are judged in
    preprocessing_stall_ms: float    # CPU-bound wait per step
    fetch_stall_ms: float            # wait per step on storage reads or latency (no core working)
    cold_fetch_stall_ms: float       # the fetch stall with a cold cache (first epoch, data > RAM)
    step_ms: float
    input_wait_ms: float
    input_share: float               # measured end to end (plus storage reads when steady is cold)
    cold_input_share: float          # with a cold cache (the first epoch)
    verdict: str
    cause: str                       # "fetch", "preprocessing" or "none"
    knee_images_per_second: float
    highly_bound_above: float
    devices: tuple[whatif.DeviceWhatIf, ...]
    cores: tuple[whatif.CoresWhatIf, ...]
    from_storage: whatif.Prediction | None
    cached: whatif.Prediction
    # "measured" (the end-to-end run itself read from the page cache) or "modelled: ..." (data read from
    # remote storage: the free cores decoding it from memory, the figure the cache advice quotes)
    cached_basis: str = "measured"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The result of `diagnose`: probes, the per-phase split, and the advice that follows."""

    source: dict[str, Any]
    pipeline: PipelineConfig
    accelerator: str
    warm: PipelineProbe
    cold: PipelineProbe | None
    pipeline_breakdown: PipelineBreakdown
    phases: tuple[PhaseDiagnosis, ...]
    advice: tuple[Advice, ...]
    seconds: float
    notes: tuple[str, ...] = ()
    analysis: Any = None             # the profile of a few end-to-end steps analysed (stage tree), if taken
    stages: tuple[str, ...] = ()     # the pipeline's stages as TF runs them, outermost first, if read
    storage: StorageFigures | None = None          # per image: requests, connections, bytes, wait
    storage_whatif: StorageWhatIf | None = None    # files vs records on other stores
    reads: ReadChain | None = None                 # records read alone where they are (a store, a mount)

    @property
    def worst(self) -> PhaseDiagnosis:
        return max(self.phases, key=lambda p: p.input_share)

    @property
    def input_share(self) -> float:
        return self.worst.input_share

    @property
    def verdict(self) -> str:
        return self.worst.verdict

    @property
    def cause(self) -> str:
        return self.worst.cause

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst
        return finite(json_ready({
            "input_share": worst.input_share,
            "verdict": worst.verdict,
            "cause": worst.cause,
            "source": self.source,
            "accelerator": self.accelerator,
            "pipeline": self.pipeline.to_dict(),
            "probes": {"warm": self.warm.to_dict(), "cold": self.cold.to_dict() if self.cold else None,
                       "reads_alone": self.reads.to_dict() if self.reads else None},
            "pipeline_breakdown": {**dataclasses.asdict(self.pipeline_breakdown),
                                   "fetch_fraction": self.pipeline_breakdown.fetch_fraction},
            "phases": [_phase_dict(p) for p in self.phases],
            "advice": [a.to_dict() for a in self.advice],
            "seconds": self.seconds,
            "notes": list(self.notes),
            "stages": list(self.stages),
            "bottleneck": self.analysis.bottleneck if self.analysis is not None else None,
            "stage_tree": self.analysis.to_dict()["stages"] if self.analysis is not None else None,
            "storage": self.storage.to_dict() if self.storage is not None else None,
            "storage_what_if": self.storage_whatif.to_dict() if self.storage_whatif is not None else None,
        }))


def finite(value: Any) -> Any:
    """JSON has no infinity or NaN: a figure that is not finite (e.g. a rate of a zero time) is None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _phase_dict(phase: PhaseDiagnosis) -> dict[str, Any]:
    data = {f.name: getattr(phase, f.name) for f in dataclasses.fields(phase)
            if f.name not in ("compute", "end_to_end", "devices", "cores", "from_storage", "cached")}
    data["probes"] = {"compute": phase.compute.to_dict(), "end_to_end": phase.end_to_end.to_dict()}
    data["what_if"] = {
        "devices": [{"device_images_per_second": d.device_images_per_second, **d.prediction.to_dict()}
                    for d in phase.devices],
        "cores": [{"extra_cores": c.extra_cores, "cores": c.cores,
                   "pipeline_images_per_second": c.pipeline_images_per_second, **c.prediction.to_dict()}
                  for c in phase.cores],
        "from_storage": phase.from_storage.to_dict() if phase.from_storage else None,
        "cached_in_memory": {**phase.cached.to_dict(), "basis": phase.cached_basis},
    }
    return data


def free_cores(probe: PipelineProbe) -> float:
    """The cores the pipeline can have here: the CPU the process may use, less what other processes
    kept busy of it during the probe (never below one core, or the quota where that is less). The
    more-cores what-if starts from these, and so does the fix's prediction, so its '+0' row and the
    predicted column are one figure."""
    return max(min(1.0, probe.cores), probe.cores - probe.other_cores_busy)


def thread_ms_per_image(parts: PipelineBreakdown, batch_size: int) -> float:
    """A pipeline thread's time per image: its CPU work plus the waiting (reads, latency) it does
    in between; parallel stages spread both over their threads."""
    return parts.cpu_ms_per_image + parts.waiting_ms / batch_size


def floor_ms_per_image(parts: PipelineBreakdown, batch_size: int, *, cold: bool) -> float:
    """What more threads cannot remove: a cold page cache's storage reads per image."""
    return parts.storage_ms / batch_size if cold else 0.0


def parallel_pipeline_ms(parts: PipelineBreakdown, config: PipelineConfig, *, cores: float, cold: bool) -> float:
    """Pipeline time per batch of `config` on `cores` cores: the one model behind the fix's
    prediction and the more-cores what-if (whose rows are this for a fully parallel config)."""
    threads = pipeline_threads(config, cores)
    return whatif.pipeline_ms_with_cores(
        cpu_ms_per_image=thread_ms_per_image(parts, config.batch_size), cores=threads,
        batch_size=config.batch_size, floor_ms_per_image=floor_ms_per_image(parts, config.batch_size, cold=cold))


def attribute(*, compute: LoopProbe, end_to_end: LoopProbe, parts: PipelineBreakdown, batch_size: int,
              cores: float, phase: str, steady_cache: str = "warm", batches_per_step: int = 1) -> PhaseDiagnosis:
    """The per-step split of one phase (pure arithmetic on measured figures).

    `cores`: the cores free for the pipeline (`free_cores`), where the more-cores what-if starts.
    `batches_per_step`: batches a loop step takes (Keras' steps_per_execution); the split and every
    prediction are per batch, the unit of the pipeline's figures: a step of 4 batches set beside the
    pipeline's time for one priced a parallel decode under steps_per_execution=4 at +124% where it
    gained +53% (benchmarks/advice_programs.py; one batch a step: +75% / +60%).

    The end-to-end wait (measured with a warm cache) is split by the warm pipeline's share of CPU
    work and waiting; a cold cache adds the storage reads as far as the overlap model says they
    would show as wait. The verdict and cause are judged in the steady cache state."""
    per_step = max(1, batches_per_step)
    step_ms, wait_ms = end_to_end.step_ms / per_step, end_to_end.input_wait_ms / per_step
    # never above the step it is part of: where the compute probe ran slower than the end-to-end steps
    # computed (a loaded machine), the end-to-end step's own compute is the figure
    compute_ms = min(compute.step_ms / per_step, max(step_ms - wait_ms, 0.0))
    serial = compute_ms + parts.warm_ms
    overlapped = abs(step_ms - max(compute_ms, parts.warm_ms)) <= abs(step_ms - serial)
    fetch_warm = wait_ms * parts.fetch_fraction
    preprocessing = wait_ms - fetch_warm
    warm_model = whatif.predict(compute_ms=compute_ms, pipeline_ms=parts.warm_ms, batch_size=batch_size,
                                overlapped=overlapped)
    from_storage = None
    storage_wait = 0.0
    if parts.cold_ms is not None:
        from_storage = whatif.predict(compute_ms=compute_ms, pipeline_ms=parts.cold_ms, batch_size=batch_size,
                                      overlapped=overlapped)
        storage_wait = max(0.0, from_storage.input_wait_ms - warm_model.input_wait_ms)
    cold_share = (wait_ms + storage_wait) / (step_ms + storage_wait) if step_ms + storage_wait > 0 else 0.0
    cold = steady_cache == "cold"
    fetch = fetch_warm + (storage_wait if cold else 0.0)
    share = cold_share if cold else end_to_end.input_share
    verdict = verdict_for(share)
    if verdict == "not":
        cause = "none"
    else:
        cause = "fetch" if fetch > preprocessing else "preprocessing"
    pipeline_ms = parts.cold_ms if cold else parts.warm_ms
    return PhaseDiagnosis(
        phase=phase, compute=compute, end_to_end=end_to_end, overlapped=overlapped,
        compute_ms=compute_ms, steady_cache=steady_cache, preprocessing_stall_ms=preprocessing,
        fetch_stall_ms=fetch, cold_fetch_stall_ms=fetch_warm + storage_wait,
        step_ms=step_ms + (storage_wait if cold else 0.0), input_wait_ms=wait_ms + (storage_wait if cold else 0.0),
        input_share=share, cold_input_share=cold_share, verdict=verdict, cause=cause,
        knee_images_per_second=whatif.knee_images_per_second(pipeline_ms=pipeline_ms, batch_size=batch_size),
        highly_bound_above=whatif.highly_bound_above(pipeline_ms=pipeline_ms, batch_size=batch_size,
                                                     overlapped=overlapped),
        devices=tuple(whatif.accelerator_sweep(
            pipeline_ms=pipeline_ms, batch_size=batch_size, overlapped=overlapped,
            device_speeds=whatif.device_speeds_past(whatif.knee_images_per_second(pipeline_ms=pipeline_ms,
                                                                                  batch_size=batch_size)))),
        cores=tuple(whatif.cores_sweep(
            cpu_ms_per_image=thread_ms_per_image(parts, batch_size), cores=cores, batch_size=batch_size,
            compute_ms=compute_ms, floor_ms_per_image=floor_ms_per_image(parts, batch_size, cold=cold))),
        from_storage=from_storage,
        cached=measured_as_prediction(end_to_end, compute_ms=compute_ms, pipeline_ms=parts.warm_ms,
                                      batches_per_step=per_step),
    )


def measured_as_prediction(run: LoopProbe, *, compute_ms: float, pipeline_ms: float,
                           batches_per_step: int = 1) -> whatif.Prediction:
    """A measured run in the what-if's terms: where a scenario is what was run (data in the page cache),
    its figures are the measured ones, never a model's beside them; per batch, as every figure beside it."""
    per_step = max(1, batches_per_step)
    return whatif.Prediction(compute_ms=compute_ms, pipeline_ms=pipeline_ms, step_ms=run.step_ms / per_step,
                             input_wait_ms=run.input_wait_ms / per_step, input_share=run.input_share,
                             images_per_second=run.images_per_second, verdict=run.verdict)


def cached_from_remote(phase: PhaseDiagnosis, *, images_per_second: float, batch_size: int) -> PhaseDiagnosis:
    """The phase with its "data cached in memory" figure for data read from remote storage: the pipeline
    at the rate the free cores decode from memory (`_cached_rate`, which the cache advice quotes too),
    modelled, since every probe read from the storage."""
    pipeline_ms = batch_size * 1000.0 / images_per_second if images_per_second > 0 else math.inf
    cached = whatif.predict(compute_ms=phase.compute_ms, pipeline_ms=pipeline_ms, batch_size=batch_size,
                            overlapped=phase.overlapped)
    return dataclasses.replace(phase, cached=cached, cached_basis=f"modelled: {images_per_second:,.0f} images/s "
                                                                  "decoded from memory on the free cores")


def steady_cache_state(options: DiagnoseOptions, data_bytes: int) -> str:
    """The page-cache state a long run settles in (see DiagnoseOptions.steady_cache)."""
    if not options.cold_cache:
        return "warm"
    if options.steady_cache != "auto":
        return options.steady_cache
    return steady_state_for(data_bytes)


def steady_state_for(data_bytes: int) -> str:
    """"warm" when the data fits in the page cache a long run keeps (FITS_IN_MEMORY_FRACTION of free RAM)."""
    fits = data_bytes <= psutil.virtual_memory().available * FITS_IN_MEMORY_FRACTION
    return "warm" if fits else "cold"


def recommend(diagnosis_phases: tuple[PhaseDiagnosis, ...], config: PipelineConfig, parts: PipelineBreakdown,
              *, examples: int, data_bytes: int, warm: PipelineProbe | None = None,
              stored_side: int | None = None, cores: float | None = None) -> list[Advice]:
    """Knob changes that address the stall the probes found, most effective first; `warm` (the
    pipeline-alone probe) tells whether a CPU quota ran out while the pipeline ran flat out;
    `stored_side` (the stored images' longer side, where read) whether smaller stored images would
    shrink anything: they are advised only from SHRINK_FROM times the model's input, priced on `cores`
    (the free cores: `free_cores`)."""
    worst = max(diagnosis_phases, key=lambda p: p.input_share)
    advice: list[Advice] = []
    evidence = (f"pipeline alone {parts.warm_ms:.1f} ms per batch warm ({parts.cpu_ms:.1f} ms CPU work on "
                f"{parts.threads:g} core(s), {parts.waiting_ms:.1f} ms waiting), compute {worst.compute_ms:.1f} ms")
    if worst.cause == "fetch" and config.read_parallelism is None:
        advice.append(Advice(
            "parallel_interleave", "Read files in parallel", {"read_parallelism": AUTOTUNE, "deterministic": False},
            "dataset = files.interleave(read_one, cycle_length=tf.data.AUTOTUNE,\n"
            "                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)",
            f"{worst.fetch_stall_ms:.1f} ms of each step waits on reads while no core works", evidence))
    if worst.cause == "preprocessing" and config.map_parallelism is None:
        advice.append(Advice(
            "parallel_map", "Decode in parallel", {"map_parallelism": AUTOTUNE},
            "dataset = dataset.map(decode_and_resize, num_parallel_calls=tf.data.AUTOTUNE)",
            f"{worst.preprocessing_stall_ms:.1f} ms of each step waits on a sequential decode map", evidence))
    refills = bool(worst.cause != "none" and examples and epoch_refill_images(config, examples) >= examples)
    if refills:
        advice.append(_shuffle_encoded(config, examples, evidence))
    if config.prefetch is None and (worst.cause != "none" or not worst.overlapped) and not refills:
        advice.append(Advice(
            "prefetch", "Prefetch at the end", {"prefetch": AUTOTUNE},
            "dataset = dataset.prefetch(tf.data.AUTOTUNE)  # the last line of the pipeline",
            "without a prefetch the next batch is made only when the step asks for it", evidence))
    free = psutil.virtual_memory().available
    if (worst.cause == "fetch" and worst.steady_cache == "cold" and parts.storage_ms > 0 and config.cache == "none"
            and data_bytes < free * CACHE_FRACTION_OF_MEMORY):
        advice.append(Advice(
            "cache", "Cache the encoded bytes in memory", {"cache": "memory", "cache_at": "encoded"},
            "dataset = dataset.cache()  # after reading, before decoding; from the second epoch on, no I/O",
            f"a cold cache adds {parts.storage_ms:.1f} ms per batch and the data ({data_bytes / 1e6:.0f} MB) "
            "fits in memory", evidence))
    if worst.cause == "preprocessing" and config.map_parallelism is not None:
        advice.append(Advice(
            "outer_parallelism", "One intra-op thread per element", {"max_intra_op_parallelism": 1}, ONE_INTRA_OP_THREAD,
            "the map is parallel already; parallelism across elements is cheaper than inside each op", evidence))
        if stored_side is not None and stored_side >= SHRINK_FROM * config.image_size:
            advice.append(_smaller_images(worst, parts, config, stored_side, cores, evidence))
    if warm is not None and warm.throttled_share is not None:  # a quota: its counters were read
        pool = quota_pool(config, cpus=warm.cpus, quota_cores=warm.cores, throttled_share=warm.throttled_share,
                          evidence=f"the CPU quota ({cpus_worth(warm.cores)}, on {warm.cpus} CPUs) ran out in "
                                   f"{warm.throttled_share:.0%} of its periods while the pipeline ran alone")
        if pool is not None:
            advice.append(pool)
    return advice


def _smaller_images(worst: PhaseDiagnosis, parts: PipelineBreakdown, config: PipelineConfig, stored: int,
                    cores: float | None, evidence: str) -> Advice:
    """Images stored a little above the model's input, priced by the more-cores what-if with the
    pipeline's CPU work per image scaled by the pixels, (target / stored side)^2: decode and resize
    cost what they touch. Unpriced where the free cores are not known."""
    from stallscope.analysis.advice import stored_side_for

    side = stored_side_for(config.image_size)
    item = Advice(
        "max_side", "Store smaller images", {},
        f"# re-convert once; decoding a {side} px JPEG costs a fraction of a {stored} px one",
        f"decoding is the slow part and its cost grows with the pixels stored: the images are stored at "
        f"{stored} px on the longer side for a {config.image_size} px input", evidence,
        command=f"stallscope convert IMAGES --output_path RECORDS --max-side {side}")
    if cores is None:
        return dataclasses.replace(item, gain_basis="not predicted: the free cores were not measured")
    scale = min(1.0, (side / stored) ** 2)
    cpu_ms = parts.cpu_ms * scale
    smaller = dataclasses.replace(parts, cpu_ms=cpu_ms, warm_ms=parts.waiting_ms + cpu_ms,
                                  cpu_ms_per_image=parts.cpu_ms_per_image * scale)
    predicted = predict_fixed(worst, smaller, config, cores=cores)
    gain = predicted_gain(worst, parts, predicted)
    return dataclasses.replace(
        item, predicted_step_ms=step_with_gain(worst, gain), predicted_gain=gain,
        gain_basis=f"the CPU work per image scaled by the pixels, ({side}/{stored})^2 = {scale:.2f}, on the "
                   f"more-cores what-if: step {worst.step_ms:.1f} -> {predicted.step_ms:.1f} ms predicted")


def _shuffle_encoded(config: PipelineConfig, examples: int, evidence: str) -> Advice:
    """The shuffle moved before the decode map, with the prefetch it lets work where there is none: a
    prefetch behind a shuffle refilling the whole epoch hides nothing (the epoch's decode comes before
    its first batch) and a shuffle moved without one leaves the decode in each step, so neither gains
    alone and the two are one fix, priced together."""
    prefetch = config.prefetch is None
    return Advice(
        "shuffle_encoded", "Shuffle before decoding" + (", prefetch at the end" if prefetch else ""),
        {"shuffle_at": "encoded", **({"prefetch": AUTOTUNE} if prefetch else {})},
        "dataset = dataset.shuffle(buffer)  # on file names / records, before the decode map"
        + ("\ndataset = dataset.prefetch(tf.data.AUTOTUNE)  # the last line of the pipeline" if prefetch else ""),
        f"a shuffle buffer of {config.shuffle_buffer} decoded images holds the whole data set "
        f"({examples} examples), so each epoch starts by decoding all of it before the first step"
        + ("; with the shuffle before decoding, a prefetch makes the next batch while the step runs" if prefetch
           else ", which the prefetch cannot hide"),
        evidence)


def stored_side(source: DataSource) -> int | None:
    """The median longer side of the first few stored images (files; a shard's first records), None
    where unknown (in a bucket, not plain JPEGs)."""
    from stallscope.analysis.stored_images import HEADER_BYTES, SAMPLED, stored_images
    from stallscope.data.images import plain_jpeg_size

    if is_remote(str(source.path)):
        return None
    if source.kind != "files":
        found = stored_images({"source": {"kind": source.kind, "path": str(source.path),
                                          "schema": getattr(source, "schema", None) or "standard"}})
        return found.side if found else None
    sides = []
    for path in source.files[:SAMPLED]:
        try:
            with open(path, "rb") as handle:
                size = plain_jpeg_size(handle.read(HEADER_BYTES))
        except OSError:
            continue
        if size:
            sides.append(max(size))
    return int(statistics.median(sides)) if sides else None


def predict_fixed(phase: PhaseDiagnosis, parts: PipelineBreakdown, new: PipelineConfig,
                  *, cores: float, examples: int = 0) -> whatif.Prediction:
    """The step the fixed config should give: the model of the more-cores what-if (`parallel_pipeline_ms`)
    on the same free cores, its stages as parallel as the new config makes them, and the overlap a
    prefetch brings. A fix that makes every stage parallel and prefetches predicts the what-if's '+0' row.
    With a cache where the page cache does not hold the data (cold), the epochs of the probe's window
    after the first are served from memory: the warm pipeline's time."""
    cold = phase.steady_cache == "cold"
    pipeline_ms = parallel_pipeline_ms(parts, new, cores=cores, cold=cold)
    if cold and new.cache != "none" and examples:
        from_store = min(1.0, _steps_per_epoch(new, examples) / max(1, phase.end_to_end.steps))
        warm_ms = parallel_pipeline_ms(parts, new, cores=cores, cold=False)
        pipeline_ms = from_store * pipeline_ms + (1.0 - from_store) * warm_ms
    return whatif.predict(compute_ms=phase.compute_ms, pipeline_ms=pipeline_ms, batch_size=new.batch_size,
                          overlapped=overlaps(phase, new, examples))


def overlaps(phase: PhaseDiagnosis, config: PipelineConfig, examples: int = 0) -> bool:
    """Whether `config`'s pipeline works while the device computes: as measured, or with a prefetch at
    the end, unless a shuffle of decoded images refills with the whole epoch (`examples`, where known)
    at each epoch start: then the decode happens before the epoch's first batch, which no prefetch hides
    (benchmarks/advice.py, seed on local files: a prefetch predicted +26% without this, measured -1%)."""
    if phase.overlapped:
        return True
    return config.prefetch is not None and not (examples and epoch_refill_images(config, examples) >= examples)


def predict_config(phase: PhaseDiagnosis, parts: PipelineBreakdown, new: PipelineConfig, *, cores: float,
                   what: StorageWhatIf | None = None, examples: int = 0) -> whatif.Prediction:
    """The one model behind every predicted figure of a diagnosis (an advice's gain, the fix's predicted
    column): `predict_fixed` for data on this machine; for data read from a bucket or a network file
    system, the storage what-if's row of the store as read (`storage_whatif.predict_config`), whose
    reads in flight, pool and decode share the same free cores."""
    row = as_read_row(what)
    if row is None:
        return predict_fixed(phase, parts, new, cores=cores, examples=examples)
    stored = predict_storage_config(what, row, new).prediction
    pipeline_ms, unhidden_ms = stored.pipeline_ms, stored.unhidden_ms
    if new.cache != "none":  # only the first epoch of the probe's window reads the storage
        from_store = min(1.0, _steps_per_epoch(new, what.workload.examples) / max(1, phase.end_to_end.steps))
        decoded = new.batch_size * sustained_cpu_ms(what.workload) / max(what.workload.cores, 1e-9)
        pipeline_ms = from_store * pipeline_ms + (1.0 - from_store) * decoded
        unhidden_ms *= from_store
    return whatif.predict(compute_ms=phase.compute_ms, pipeline_ms=pipeline_ms, batch_size=new.batch_size,
                          overlapped=overlaps(phase, new, examples), unhidden_ms=unhidden_ms)


def predict_change(phase: PhaseDiagnosis, parts: PipelineBreakdown, config: PipelineConfig, new: PipelineConfig,
                   *, cores: float, what: StorageWhatIf | None = None, examples: int = 0) -> whatif.Prediction:
    """The step `new` should give where `config` was measured. Data on this machine: the more-cores
    what-if (`predict_fixed`), whose '+0' row is the same figure. Data on remote storage: the storage
    what-if's pipeline time for `new`, scaled by how the measured pipeline-alone time of `config` stands
    to the model's for it, so a change is predicted by what the model says it changes, not by what the
    model misses of the pipeline as it stands (TF's own threads, the storage's server on these cores)."""
    if as_read_row(what) is None:  # the more-cores what-if, on the measured figures: its '+0' row, unscaled
        return predict_fixed(phase, parts, new, cores=cores, examples=examples)
    now = predict_config(phase, parts, config, cores=cores, what=what, examples=examples)
    changed = predict_config(phase, parts, new, cores=cores, what=what, examples=examples)
    scale = parts.warm_ms / now.pipeline_ms if now.pipeline_ms > 0 and parts.warm_ms > 0 else 1.0
    return whatif.predict(compute_ms=phase.compute_ms, pipeline_ms=changed.pipeline_ms * scale,
                          batch_size=new.batch_size, overlapped=overlaps(phase, new, examples),
                          unhidden_ms=changed.unhidden_ms * scale)


def predicted_gain(phase: PhaseDiagnosis, parts: PipelineBreakdown, predicted: whatif.Prediction) -> float:
    """Step time now over the predicted one, less 1, both in the model's terms (the measured pipeline
    and compute, overlapped as measured)."""
    now = whatif.predict(compute_ms=phase.compute_ms, pipeline_ms=parts.warm_ms, batch_size=1,
                         overlapped=phase.overlapped)
    return now.step_ms / predicted.step_ms - 1.0 if predicted.step_ms > 0 else math.inf


def step_with_gain(phase: PhaseDiagnosis, gain: float) -> float:
    """The phase's measured step shortened by a predicted gain (`predicted_gain`): what a fix reports."""
    return phase.step_ms / (1.0 + gain) if math.isfinite(gain) else 0.0


# Knobs the models of `predict_config` see: parallel stages and their pool, the overlap a prefetch gives
# (and a shuffle refilling each epoch takes away), who reads gs://, a cache serving the epochs after the
# first; a TF default such as intra-op threads changes nothing they model.
MODELLED_KNOBS = frozenset({"map_parallelism", "read_parallelism", "private_threadpool_size", "prefetch",
                            "gcs_reader", "deterministic", "shuffle_at", "cache", "cache_at"})


def price_advice(advice: Sequence[Advice], phases: tuple[PhaseDiagnosis, ...], parts: PipelineBreakdown,
                 config: PipelineConfig, *, cores: float, what: StorageWhatIf | None = None,
                 examples: int = 0) -> tuple[list[Advice], list[Advice]]:
    """(fixes, checked): every fix carries the gain the model predicts for it applied alone to the
    worst phase; one predicted under MIN_GAIN, or not predicted at all (its knobs are outside the model,
    or a change outside the config came without a figure), is checked, not a fix. One that changes
    nothing (its knobs are set already) is dropped. A marker fix and a quota's pool (which evens steps
    out, it does not shorten them) stay fixes unpredicted."""
    from stallscope.analysis.fix_gain import MIN_GAIN

    worst = max(phases, key=lambda p: p.input_share)
    fixes, checked = [], []
    for item in advice:
        if item.key in UNPREDICTED_FIXES:
            fixes.append(item)
            continue
        if item.knobs:
            if apply_advice(config, item) == config:
                continue
            item = _priced(item, worst, parts, config, cores=cores, what=what, examples=examples)
        elif item.predicted_gain is None and not item.gain_basis.startswith("not predicted"):
            item = dataclasses.replace(item, gain_basis="not predicted: " + (item.gain_basis or
                                                                              "the model has no figure for it"))
        gain = item.predicted_gain
        (fixes if gain is not None and gain >= MIN_GAIN else checked).append(item)
    return fixes, checked


def _priced(item: Advice, worst: PhaseDiagnosis, parts: PipelineBreakdown, config: PipelineConfig, *,
            cores: float, what: StorageWhatIf | None, examples: int) -> Advice:
    """The advice with the step the model predicts with its knobs applied alone; "not predicted" where
    a knob it changes is outside the model (which would say "no gain" for what it does not see)."""
    unmodelled = sorted(k for k, v in item.knobs.items() if k not in MODELLED_KNOBS and getattr(config, k) != v)
    if unmodelled:
        return dataclasses.replace(item, gain_basis=f"not predicted: the model has no term for {', '.join(unmodelled)}")
    predicted = predict_change(worst, parts, config, apply_advice(config, item), cores=cores, what=what,
                               examples=examples)
    gain = predicted_gain(worst, parts, predicted)
    step = step_with_gain(worst, gain)
    basis = (f"step {worst.step_ms:.1f} -> {step:.1f} ms predicted, "
             + ("the storage what-if at the store as read" if as_read_row(what) else "the more-cores what-if"))
    return dataclasses.replace(item, predicted_step_ms=step, predicted_gain=gain, gain_basis=basis)


def changes_cache(advice: Advice, config: PipelineConfig) -> bool:
    """Whether `advice` adds or moves a cache (its knobs change `cache` or `cache_at`)."""
    return any(k in ("cache", "cache_at") and getattr(config, k) != v for k, v in advice.knobs.items())


def checked_note(advice: Advice) -> str:
    """The note for a change `price_advice` checked: expected to gain under its least gain, or not
    predicted (then not advised: stallscope lists as fixes only what its model prices)."""
    from stallscope.analysis.fix_gain import below_least_gain_text

    if advice.predicted_gain is None:
        return f"checked, not advised: {advice.title} ({advice.gain_basis}; measure it before relying on it)"
    return f"checked, {below_least_gain_text(advice)}: {advice.title} ({advice.gain_basis})"


def with_service(advice: list[Advice], service: Advice | None, notes: list[str]) -> list[Advice]:
    """The advice with the service's where it gains its least gain (other machines), else a note."""
    from stallscope.analysis.fix_gain import least_gain

    if service is None:
        return advice
    if service.predicted_gain is not None and service.predicted_gain >= least_gain(service.key):
        return [*advice, service]
    notes.append(checked_note(service))
    return advice


def most_helpful_first(advice: Sequence[Advice]) -> list[Advice]:
    """The order every listing of fixes keeps: the marker fix first (nothing is measured without it),
    then by predicted gain, highest first, then the fixes the model gives no figure for (a quota's
    pool, which evens steps out); ties keep the order they were found in."""
    def rank(item: Advice) -> tuple[bool, float]:
        gain = item.predicted_gain
        return item.key != "step_marker", -gain if gain is not None else math.inf
    return sorted(advice, key=rank)


def _steps_per_epoch(config: PipelineConfig, examples: int) -> int:
    return max(1, examples // config.batch_size if config.drop_remainder else math.ceil(examples / config.batch_size))


# A shuffle of decoded images of this share of an epoch or more refills visibly at each epoch start.
REFILL_SHARE = 0.1
# The end-to-end window is stretched to one whole epoch for such a shuffle up to this many steps, and
# this long at the step time the compute and pipeline probes give (a real model on a CPU: seconds a step).
EPOCH_WINDOW_MAX_STEPS = 1000
EPOCH_WINDOW_MAX_S = 60.0


def epoch_refill_images(config: PipelineConfig, examples: int) -> int:
    """Images a shuffle of decoded images decodes at each epoch start before its first batch (the
    repeat comes after it, so its buffer empties at each epoch end and fills again); 0 for a shuffle
    of file names or encoded records, or none; 0 too where TF fuses the shuffle with that repeat and
    the buffer is no larger than the epoch: the fused stage keeps its buffer from one epoch into the next."""
    if config.shuffle_at != "decoded" or not config.shuffle_buffer:
        return 0
    if config.shuffle_and_repeat_fusion is not False and config.shuffle_buffer <= examples:
        return 0
    return min(config.shuffle_buffer, examples)


def measured_steps(options: DiagnoseOptions, examples: int, step_ms: float | None = None) -> int:
    """probe_steps, rounded to whole epochs when an epoch is short, or when a shuffle of decoded
    images refills a tenth of the epoch or more at each epoch start and one epoch is affordable
    (`window_steps`; `step_ms`: the step time expected): the first batch of each epoch waits for the
    refill, and a window without an epoch start is served from a full buffer (the seed pipeline, 480
    images in batches of 8: 9.6% of the step waiting in a window of 20 steps, 83% over a 300-step run)."""
    refills = epoch_refill_images(options.pipeline, examples) >= REFILL_SHARE * examples
    return window_steps(options.probe_steps, _steps_per_epoch(options.pipeline, examples), refills=refills,
                        step_ms=step_ms)


def window_steps(probe_steps: int, per_epoch: int, *, refills: bool, step_ms: float | None = None) -> int:
    """`probe_steps`, or whole epochs where an epoch is short or (`refills`: a shuffle buffer fills
    again at each epoch start) at most EPOCH_WINDOW_MAX_STEPS long and, at `step_ms` a step where
    that is known, at most EPOCH_WINDOW_MAX_S."""
    affordable = per_epoch <= EPOCH_WINDOW_MAX_STEPS and (step_ms is None or per_epoch * step_ms <= EPOCH_WINDOW_MAX_S * 1000)
    if per_epoch <= 2 * probe_steps or (refills and affordable):
        return per_epoch * max(1, round(probe_steps / per_epoch))
    return probe_steps


def refill_note(config: PipelineConfig, examples: int, warm: PipelineProbe, steps: int) -> str | None:
    """What a window of `steps` without an epoch start leaves out, where a large shuffle of decoded
    images refills each epoch but an epoch is too long to probe whole; None where the window holds epochs."""
    per_epoch = _steps_per_epoch(config, examples)
    refill = epoch_refill_images(config, examples)
    if refill < REFILL_SHARE * examples or steps % per_epoch == 0:
        return None
    return (f"the end-to-end window ({steps} steps) holds no epoch start, where the shuffle of decoded images "
            f"refills with {refill:,} images before the epoch's first batch: about "
            f"{refill * warm.ms_per_image / 1000.0:.1f} s at the pipeline's rate alone, once in each epoch of "
            f"{per_epoch:,} steps, which the input share above leaves out; --probe-steps {per_epoch} measures a "
            "whole epoch, and shuffling before decoding (--shuffle-at encoded) removes the refill")


def precision_note(probe: LoopProbe, target) -> str:
    """The precision a --precision end-to-end probe reached, or that it stopped short of it."""
    where = f"the end-to-end probe ({probe.phase}) ran to --precision {target.tolerance:.0%}: "
    if probe.halves_spread is None:
        return where + f"its {probe.steps} measured steps were too few to compare two halves; raise --max-seconds"
    spread = f"its halves' images/s {probe.halves_spread:.1%} apart over {probe.steps} measured steps"
    if probe.stopped_by == "precision":
        return where + f"reached, {spread}"
    stopped = f"by --max-seconds {target.max_seconds:g} s" if probe.stopped_by == "max_seconds" \
        else f"(stopped by {probe.stopped_by})"
    return where + f"not reached {stopped}, {spread}; raise --max-seconds or loosen --precision"


class Prober:
    """Runs the loop probes of one diagnosis, sharing its source, work directory and hooks."""

    def __init__(self, options: DiagnoseOptions, source, work_dir: Path) -> None:
        self.options = options
        self.source = source
        self.work_dir = work_dir
        self.counter = 0

    def _train_options(self, config: PipelineConfig, phase: str, steps: int, name: str) -> TrainOptions:
        self.counter += 1
        return dataclasses.replace(
            self.options.train, pipeline=config, fine_tune=phase, steps=steps, epochs=1, dataset_size=None,
            log_path=self.work_dir / f"{self.counter:02d}-{name}-{phase.replace(':', '_')}",
            checkpoint_path=None, profile_steps=None, validation_path=None, log_every=10**9, precision=None,
        )

    def _dataset(self, config: PipelineConfig):
        from stallscope.pipeline.builder import build_dataset

        return build_dataset(config, self.source, repeat=True, num_classes=self.source.num_classes,
                             extra_stages=self.options.extra_stages)

    def compute(self, config: PipelineConfig, phase: str) -> LoopProbe:
        from stallscope.workload.train import run_training

        warmup = max(COMPUTE_CACHED_BATCHES, self.options.train.warmup_steps)
        dataset = self._dataset(config).take(COMPUTE_CACHED_BATCHES).cache().repeat()
        options = dataclasses.replace(self._train_options(config, phase, warmup + self.options.probe_steps,
                                                          "compute"), warmup_steps=warmup)
        result = run_training(options, dataset=dataset, source=self.source)
        return LoopProbe.from_steps("compute", phase, result.steps)

    def end_to_end(self, config: PipelineConfig, phase: str, measured: int) -> LoopProbe:
        """`measured` steps after the warm-up (`measured_steps`); with a precision target, as many as
        `train --precision` runs until the halves agree (or its max_seconds)."""
        from stallscope.workload.train import run_training

        warmup, target = self.options.train.warmup_steps, self.options.train.precision
        options = dataclasses.replace(self._train_options(config, phase, warmup + measured, "end_to_end"),
                                      warmup_steps=warmup)
        if target is not None:
            options = dataclasses.replace(options, steps=None, precision=target)
        result = run_training(options, dataset=self._dataset(config), source=self.source)
        stopped_by = (result.summary.get("precision") or {}).get("stopped_by") if target is not None else None
        return LoopProbe.from_steps("end_to_end", phase, result.steps, target=target, stopped_by=stopped_by)


def open_probed_source(options: DiagnoseOptions) -> DataSource:
    """The data the probes read. `diagnose` and `fix` take it opened once, so a run that does both lists
    a large tree or a bucket once (3.7 s a listing for ImageNet train's 1.28 million local files here;
    a bucket's pages take longer)."""
    from stallscope.tfimport import import_tensorflow

    import_tensorflow()
    from stallscope.pipeline.sources import open_source

    train = options.train
    return open_source(train.source, train.dataset_path, train.split, train.labels_file)


def diagnose(options: DiagnoseOptions, *, progress: Callable[[str], None] | None = None,
             source: DataSource | None = None) -> Diagnosis:
    """Runs the probes and splits each phase's step into compute, preprocessing and fetch stalls.
    `source`: `open_probed_source(options)`, when the caller has it already."""
    from stallscope.tfimport import import_tensorflow

    import_tensorflow()
    if source is None:
        source = open_probed_source(options)
    from stallscope.pipeline.presets import tuned_for_source

    say = progress or (lambda message: logger.info("%s", message))
    started = time.perf_counter()
    train = options.train
    with ProbeRunDirs(options) as work_dir:
        prober = Prober(options, source, work_dir)
        under = storage_under(source.path)
        file_trips = None
        if under.kind == "network-fs":
            say(FILE_TIMING_STEP)
            file_trips = time_file_round_trips([str(f) for f in source.files])
        # as `train` would read this source (on a network file system, sized by the round trip just timed)
        config = tuned_for_source(options.pipeline, source,
                                  round_trip_ms=file_trips.open_and_read_ms if file_trips else None)
        max_images = source.num_examples
        cold = None
        probe_notes = []
        in_store = is_remote(str(source.path))
        if options.cold_cache and under.remote:
            # Both probes would read the same objects from the store, and their difference is noise.
            where = f"in a store ({source.path})" if in_store else f"on a network file system ({under.label})"
            probe_notes.append(f"cold page cache not probed: the data is {where}, which every epoch reads again, "
                               "so the pipeline-alone probe measures reads from it; the local page-cache and I/O "
                               "counters do not see those reads (storage per image has them)")
        elif options.cold_cache:
            say("probe: pipeline alone, cold page cache")
            cold = probe_pipeline(config, source, cache_state="cold", max_images=max_images,
                                  budget_s=options.pipeline_budget_s, extra_stages=options.extra_stages)
            max_images = min(max_images, cold.images)  # the warm probe reads the elements now cached
        repeats = cold is None or cold.images >= source.num_examples  # every element is cached: passes may repeat
        say("probe: pipeline alone, warm page cache")
        counted_before = _read_counters(options)
        read_before = request_tally.snapshot()
        daemons = DaemonClock().start() if under.fuse else None
        warm = probe_pipeline(config, source, cache_state="warm", max_images=max_images,
                              min_s=MIN_STEADY_S if repeats else 0.0,
                              budget_s=options.pipeline_budget_s, extra_stages=options.extra_stages)
        requests = request_tally.snapshot().since(read_before)
        server_cpu = daemon_cpu_per_image(daemons, warm.images, under, probe_notes)
        if quota_limited(warm.throttled_share):
            probe_notes.append(f"the cgroup's CPU quota ({cpus_worth(warm.cores)}) ran out in "
                               f"{warm.throttled_share:.0%} of its periods during the pipeline probe: the quota, "
                               "not the CPUs, limits the pipeline here, and more cores means a larger quota")
        served = _read_counters(options) - counted_before if counted_before is not None else None
        round_trips = bandwidth = None
        if in_store:
            say(TIMING_STEP)
            round_trips, bandwidth = time_store([str(f) for f in source.files])
        reads = None
        if under.remote and source.kind == "records":
            say(READS_STEP)
            reads = probe_record_reads(config, source, budget_s=READS_BUDGET_S, max_records=source.num_examples)
        parts = breakdown(warm, cold, config)
        steady = "warm" if cold is None else steady_cache_state(options, source.total_bytes)
        phases = []
        for phase in options.phases:
            say(f"probe: compute alone ({phase})")
            compute = prober.compute(config, phase)
            # the slowest a step can be is compute and pipeline in turn: an epoch's window is bounded by it
            measured = measured_steps(options, source.num_examples, step_ms=compute.step_ms + warm.ms_per_batch)
            target = options.train.precision
            say(f"probe: end to end ({phase})" + (f", until its halves agree within {target.tolerance:.0%}"
                                                  if target is not None else ""))
            end_to_end = prober.end_to_end(config, phase, measured)
            if (note := refill_note(config, source.num_examples, warm, end_to_end.steps)) and note not in probe_notes:
                probe_notes.append(note)
            if target is not None:
                probe_notes.append(precision_note(end_to_end, target))
            phases.append(attribute(compute=compute, end_to_end=end_to_end, parts=parts,
                                    batch_size=config.batch_size, cores=free_cores(warm), phase=phase,
                                    steady_cache=steady))
    phases = tuple(phases)
    if under.remote:
        phases = tuple(cached_from_remote(p, images_per_second=_cached_rate(warm, parts, True),
                                          batch_size=config.batch_size) for p in phases)
    from stallscope.storage.tfdata_readers import describe_reader

    advice = recommend(phases, config, parts, examples=source.num_examples, data_bytes=source.total_bytes, warm=warm,
                       stored_side=stored_side(source), cores=free_cores(warm))
    figures, what, notes = storage_section(options, source, config, warm, parts, phases, served, requests,
                                           round_trips, bandwidth, under=under, file_trips=file_trips, reads=reads,
                                           server_cpu_ms_per_image=server_cpu)
    advice = merge_advice(advice, storage_advice(
        what, config, data_bytes=source.total_bytes, memory_bytes=psutil.virtual_memory().available,
        local_images_per_second=_cached_rate(warm, parts, under.remote), dataset_path=str(source.path)))
    advice, checked = price_advice(advice, phases, parts, config, cores=free_cores(warm),
                                   what=what if under.remote else None, examples=source.num_examples)
    notes = (*notes, *map(checked_note, checked))
    service = service_advice(max(phases, key=lambda p: p.input_share), parts, batch_size=config.batch_size,
                             cores=free_cores(warm), own_workload=True, assumptions=options.service,
                             bytes_per_element=float(config.batch_size * decoded_image_bytes(config.image_size)))
    if not config.data_service:
        more = list(notes)
        advice = with_service(list(advice), service, more)
        notes = tuple(more)
    advice = most_helpful_first(advice)
    return Diagnosis(
        source={"kind": source.kind, "path": str(source.path), "split": source.split,
                "examples": source.num_examples, "files": len(source.files), "bytes": source.total_bytes,
                "storage": storage_summary(under, file_trips, round_trips),
                "reader": describe_reader(source.kind, source.files, read_parallelism=config.read_parallelism,
                                          map_parallelism=config.map_parallelism,
                                          private_pool=config.private_threadpool_size,
                                          gcs_reader=config.gcs_reader)},
        pipeline=config, accelerator=train.accelerator.spec, warm=warm, cold=cold, pipeline_breakdown=parts,
        phases=phases, advice=tuple(advice), seconds=time.perf_counter() - started, notes=(*probe_notes, *notes),
        storage=figures, storage_whatif=what, reads=reads,
    )


def _cached_rate(warm: PipelineProbe, parts: PipelineBreakdown, in_store: bool) -> float:
    """images/s of epochs read from a cache: the warm probe's for local data (its page cache); for data
    in a store, which the warm probe read from, what the free cores decode at its CPU per image."""
    if not in_store or parts.cpu_ms_per_image <= 0:
        return warm.images_per_second
    return 1000.0 * free_cores(warm) / parts.cpu_ms_per_image


COUNTERS_SETTLE_S = 0.1   # a store rewrites its counters file a little after serving (ours: within 20 ms)
COUNTERS_SETTLE_MAX_S = 2.0


def _read_counters(options: DiagnoseOptions) -> StorageCounters | None:
    """The counters file once it has stopped moving (two reads COUNTERS_SETTLE_S apart agree), so the
    last requests of a probe are not left out by a file written a moment after them."""
    if options.storage_counters is None:
        return None
    counted = load_storage_counters(options.storage_counters)
    deadline = time.monotonic() + COUNTERS_SETTLE_MAX_S
    while time.monotonic() < deadline:
        time.sleep(COUNTERS_SETTLE_S)
        again = load_storage_counters(options.storage_counters)
        if again == counted:
            break
        counted = again
    return counted


FILE_TIMING_STEP = "probe: the network file system's round trip (files opened and read one at a time)"
def daemon_cpu_per_image(daemons: DaemonClock | None, images: int, under: StorageUnder,
                         notes: list[str]) -> float:
    """The FUSE daemons' CPU per image over the warm probe (ms), with a note saying it; 0 where the data
    is not on a FUSE mount, and where no daemon could be seen (another user's: said in a note)."""
    if daemons is None or (daemons.own and not daemons.pids):  # this process serves it: its CPU is counted
        return 0.0
    if not daemons.pids:
        notes.append(f"the {under.label}'s daemon is not visible to this process (another user's): its CPU on "
                     "these cores is not counted, so reads in flight may be predicted to gain more than they do")
        return 0.0
    per_image = daemons.seconds() * 1000.0 / images if images else 0.0
    notes.append(f"the {under.label} is served on this host (FUSE, pid {', '.join(map(str, daemons.pids))}): "
                 f"{per_image:.2f} ms of its CPU per image during the pipeline probe, counted with the pipeline's "
                 "CPU on these cores, not as waiting")
    return per_image


READS_STEP = "probe: records read alone, one stream, no decode"
READS_BUDGET_S = 1.5


def storage_summary(under: StorageUnder, file_trips: FileRoundTrips | None,
                    round_trips: RequestTally | None) -> dict[str, Any]:
    """What storage the data is on and its round trip as measured here: {"kind", "type", "label",
    "round_trip_ms", "round_trip", "basis"} ("measured", or "none" where nothing was timed)."""
    if file_trips is not None and file_trips.open_and_read_ms is not None:
        trip, what = file_trips.open_and_read_ms, "open + read"
    elif round_trips is not None and round_trips.requests:
        trip, what = round_trips.percentile_ms(0.1), "request"
    else:
        trip, what = None, None
    return {**under.to_dict(), "round_trip_ms": trip, "round_trip": what,
            "basis": "measured" if trip is not None else "none"}


def storage_section(options: DiagnoseOptions, source, config: PipelineConfig, warm: PipelineProbe,
                    parts: PipelineBreakdown, phases: tuple[PhaseDiagnosis, ...],
                    served: StorageCounters | None, requests: RequestTally | None = None,
                    round_trips: RequestTally | None = None, bandwidth: float | None = None, *,
                    under: StorageUnder | None = None, file_trips: FileRoundTrips | None = None,
                    reads: ReadChain | None = None,
                    server_cpu_ms_per_image: float = 0.0) -> tuple[StorageFigures, StorageWhatIf, tuple[str, ...]]:
    """Storage per image (measured by the store where its counters moved, else by stallscope's reader
    where it read, else modelled) and the storage what-if, from the probes' figures: nothing here is
    measured twice. Data on a network file system is modelled as POSIX opens and reads, its latency
    from `file_trips`, never as an object store's client. `reads`: the records read alone where they are,
    which the what-if's row of that storage takes as measured."""
    notes = []
    client = options.storage_client or client_for_path(str(source.path), config.gcs_reader)
    networked = under is not None and under.kind == "network-fs"
    own_client = "network-fs" if networked else client
    pattern = pattern_for(source.kind, examples=source.num_examples, total_bytes=source.total_bytes,
                          files=len(source.files))
    if served is not None and served.requests == 0:
        notes.append(f"the store's counters ({options.storage_counters}) did not move during the pipeline probe: "
                     "the data was not read through it, so requests are modelled")
    pattern = measured_pattern(pattern, served, warm.images)
    worst = max(phases, key=lambda p: p.input_share)
    as_read = as_read_file_system(file_trips.open_and_read_ms, file_trips.count, under.label, under.fstype) \
        if networked and file_trips is not None else None
    figures, what = storage_model(pattern, client, config, warm, parts, worst, examples=source.num_examples,
                                  scenarios=options.storage_scenarios, requests=requests,
                                  in_store=under.remote if under is not None else is_remote(str(source.path)),
                                  round_trips=round_trips, bandwidth=bandwidth, figures_client=own_client,
                                  as_read=as_read, reads=reads, server_cpu_ms_per_image=server_cpu_ms_per_image)
    return figures, what, tuple(notes)


def storage_model(pattern: IoPattern, client: str, config: PipelineConfig, warm: PipelineProbe,
                  parts: PipelineBreakdown, phase: PhaseDiagnosis, *, examples: int,
                  scenarios: Sequence[StorageScenario] = (),
                  requests: RequestTally | None = None, in_store: bool = False,
                  round_trips: RequestTally | None = None,
                  bandwidth: float | None = None, figures_client: str | None = None,
                  as_read: StorageScenario | None = None,
                  reads: ReadChain | None = None,
                  server_cpu_ms_per_image: float = 0.0) -> tuple[StorageFigures, StorageWhatIf]:
    """Storage per image and the storage what-if of `config` reading `pattern` through `client`, from
    the probes' figures (stallscope's pipeline here, a dataset of your own in `dataset_storage`);
    `requests`: the requests stallscope's reader made during the warm probe, measured figures for a
    store that counts nothing itself. in_store: the data is read from a store, so the local read
    calls (evidence that they do not carry over to requests) say nothing and are left out.
    round_trips, bandwidth: one-byte GETs timed one at a time and the bytes/s of ranged GETs of shards
    (`round_trips.time_store`): the store as read. figures_client: the client the data is read with here,
    where it is not `client` (a network file system's); as_read: the storage the data is on, as read,
    where the caller timed it (a network file system)."""
    io = None if in_store else warm.io_per_image
    figures = storage_figures(pattern, client_named(figures_client or client),
                              wait_ms_per_image=(parts.waiting_ms + parts.storage_ms) / config.batch_size,
                              read_calls=io.read_calls if io else None, files_opened=io.files_opened if io else None,
                              requests=requests, images=warm.images)
    pattern = reader_pattern(pattern, requests, warm.images)
    workload = Workload(cpu_ms_per_image=parts.cpu_ms_per_image, cores=free_cores(warm),
                        compute_ms=phase.compute_ms, batch_size=config.batch_size, overlapped=phase.overlapped,
                        examples=examples, machine_cores=warm.cpus or warm.cores, chain_ms_per_image=warm.steady_ms_per_image,
                        read_chain_ms_per_image=reads.ms_per_image if reads else None,
                        read_chain_cpu_ms_per_image=reads.cpu_ms_per_image if reads else None,
                        server_cpu_ms_per_image=server_cpu_ms_per_image)
    if as_read is None:
        timed_by = obstore_client_for(client_named(client).scheme)
        as_read = as_read_scenario(round_trips, timed_by, bandwidth_bytes_per_s=bandwidth)
    return figures, storage_whatif(pattern, config, workload, scenarios=scenarios, object_client=client,
                                   as_read=as_read)


class ProbeRunDirs:
    """The probes' run directories: the user's work_dir (kept) or a temporary one (removed)."""

    def __init__(self, options: DiagnoseOptions) -> None:
        self.given = options.work_dir
        self.path: Path | None = None

    def __enter__(self) -> Path:
        if self.given is not None:
            self.given.mkdir(parents=True, exist_ok=True)
            self.path = self.given
        else:
            self.path = Path(tempfile.mkdtemp(prefix="stallscope-diagnose-"))
        return self.path

    def __exit__(self, *exc_info) -> None:
        if self.given is None and self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
