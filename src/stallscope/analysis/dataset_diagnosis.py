"""The differential diagnosis of a user's own `tf.data.Dataset` (and model), as `diagnose` runs it
on a stallscope workload: the same probes (`probes.py`), the same split and advice (`differential.py`).

What differs is only what is known about the pipeline: its stages come from the dataset's own graph
(the chain TF runs, after its static rewrites), its files from the file names the graph holds
(constants naming existing files, or patterns `list_files` matches), so the cold-cache probe runs
where the files are known and says so where they are not. The end-to-end probe also profiles a few
steps with step markers, which gives the `tf.data` stage tree and the stage that limits it.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stallscope.analysis import differential, whatif
from stallscope.analysis.advice import GENERATOR_STAGES, Advice, parallel_generator
from stallscope.analysis.dataset_passes import Passes, passes
from stallscope.analysis.dataset_storage import ReadMap, dataset_storage
from stallscope.analysis.probes import probe_dataset, probe_loop
from stallscope.analysis.service_advice import service_advice
from stallscope.analysis.service_sizing import ServiceAssumptions
from stallscope.analysis.storage_whatif import CLIENTS, StorageScenario
from stallscope.analysis.tfdata import ASYNC_PREFIXES
from stallscope.config import AUTOTUNE, require_folder_to_write
from stallscope.errors import UsageError
from stallscope.pipeline.config import PipelineConfig
from stallscope.pipeline.describe import (
    chain_in, decodes_images, given_name, graph_as_run, map_parallelism_in, pipeline_record,
)
from stallscope.storage import request_tally
from stallscope.storage.fuse_daemons import DaemonClock
from stallscope.storage.location import as_path, is_remote, listed_size
from stallscope.storage.round_trips import TIMING_STEP, time_store
from stallscope.storage.s3_request_plan import READ_STAGE
from stallscope.storage.under import StorageUnder, storage_under, time_file_round_trips
from stallscope.verdict import fmt_share
from stallscope.workload.accelerator import EmulatedDevice, parse_accelerator
from stallscope.workload import rundir
from stallscope.workload.fit_loop import eager_steps, fed_to, model_steps, steps_per_execution
from stallscope.workload.profiling import ProfileWindow, StepProfiler
from stallscope.workload.resources import ResourceMonitor

logger = logging.getLogger(__name__)

WARMUP_STEPS = 2
PROFILED_STEPS = 8           # end-to-end steps profiled after the measured ones, for the stage tree
COMPUTE_CACHED_BATCHES = differential.COMPUTE_CACHED_BATCHES
PIPELINE_BUDGET_S = 10.0
MAP_STAGES = ("Map", "ParallelMap", "MapAndBatch")
SHORT_STEP_MS = 10.0  # steps this short put scheduling noise of a fraction of a ms at several points of share
BATCH_STAGES = ("Batch", "MapAndBatch", "PaddedBatch", "ParallelBatch", "DenseToRaggedBatch", "RaggedBatch")
_GLOB_CHARS = frozenset("*?[")
SERVICE_OPS = frozenset({"DataServiceDataset", "DataServiceDatasetV2", "DataServiceDatasetV3", "DataServiceDatasetV4"})
SERVED_NOTE = ("the dataset is served by the tf.data service (distribute): its stages run on the workers, so from "
               "here the probes see the service's delivery (elements/s, the wait per step, the trainer's CPU to "
               "receive) and the compute, not the workers' stage tree, CPU or files: the stage tree shows one "
               "DataService stage and no cold-cache probe ran; a wait with no core busy here is the workers' "
               "pace (more workers, or fewer bytes per element); diagnose the dataset before distribute() (as a "
               "worker runs it) for its stages, and `stallscope serve` prints each worker's CPU")
MAX_FILES = 100_000          # file names read from one constant of the dataset's graph


@dataclasses.dataclass(frozen=True)
class DatasetDiagnoseOptions:
    """steps: measured steps of the compute and end-to-end probes (and batches of the pipeline probes).
    accelerator: the device the compute probe emulates when no model is given ("emulated:2000").
    files: the dataset's files, when the graph does not name them (None: found in the graph).
    profile: profile a few end-to-end steps for the stage tree.
    work_dir: where that profile is kept (a new folder inside it each call); None: a temporary folder,
    removed before diagnose returns (the analysis keeps its figures; its paths say the profile was not kept).
    storage_scenarios: the storage what-if's scenarios (none: the presets, and only where the files are
    in a store). storage_client: the object-store client it models (None: the one the graph reads with).
    service: the tf.data service's link and workers' cores where given, for its sizing (else assumed)."""

    steps: int = 30
    accelerator: str = "emulated:2000"
    files: tuple[str, ...] | None = None
    pipeline_budget_s: float = PIPELINE_BUDGET_S
    profile: bool = True
    storage_scenarios: tuple[StorageScenario, ...] = ()
    storage_client: str | None = None
    work_dir: Path | None = None
    service: ServiceAssumptions = ServiceAssumptions()

    def __post_init__(self) -> None:
        if self.work_dir is not None:
            object.__setattr__(self, "work_dir", require_folder_to_write("work_dir", self.work_dir))
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 2:
            raise UsageError(f"steps: expected an integer >= 2, got {self.steps!r}")
        parse_accelerator(self.accelerator)
        if self.files is not None:
            object.__setattr__(self, "files", tuple(str(f) for f in self.files))
            missing = [f for f in self.files if not _is_file(f)]
            if missing:
                raise UsageError(f"files: {missing[0]!r} is not a file")
        if self.storage_client is not None and self.storage_client not in CLIENTS:
            raise UsageError(f"storage_client: expected one of {', '.join(CLIENTS)}, got {self.storage_client!r}")
        if not (isinstance(self.pipeline_budget_s, (int, float)) and self.pipeline_budget_s > 0):
            raise UsageError(f"pipeline_budget_s: expected a number above 0, got {self.pipeline_budget_s!r}")


def diagnose_dataset(dataset, *, model=None, options: DatasetDiagnoseOptions | None = None,
                     progress: Callable[[str], None] | None = None) -> differential.Diagnosis:
    """Runs the probes on `dataset` (batches of (inputs, targets)) and splits the step as `diagnose` does."""
    _require_dataset(dataset)
    options = options or DatasetDiagnoseOptions()
    say = progress or (lambda message: logger.info("%s", message))
    started = time.perf_counter()
    notes: list[str] = []
    seen = _read_dataset(dataset, options, notes)
    take_step, device_name, per_step = _device(model, options.accelerator)
    feed = fed_to(model)  # a strategy's model: its distributed dataset; else the dataset as given
    alone = _probe_pipeline_alone(dataset, seen, options, notes, say)
    warm = alone.warm
    private_pool = dataset.options().threading.private_threadpool_size or 0
    dataset_passes = _passes_of(dataset, notes)
    config = config_from_chain(seen.chain, batch_size=max(1, warm.batch_size), private_pool=private_pool,
                               shuffle=dataset_passes, map_parallelism=_map_parallelism(seen.ran, seen.chain))
    parts = differential.breakdown(warm, alone.cold, config)
    data_bytes = _data_bytes(seen.files)
    steady = differential.steady_state_for(data_bytes) if alone.cold is not None else "warm"
    compute, end_to_end, analysis = _probe_training(dataset, feed, take_step, seen, dataset_passes, warm, options,
                                                    notes, say, per_step=per_step)
    phase = differential.attribute(compute=compute, end_to_end=end_to_end, parts=parts,
                                   batch_size=config.batch_size, cores=differential.free_cores(warm), phase="train",
                                   steady_cache=steady, batches_per_step=per_step)
    if per_step > 1:
        notes.append(f"a step of the model's train function runs {per_step} batches (steps_per_execution={per_step}): "
                     "the step, wait and compute figures and every prediction are per batch, the pipeline's unit")
    if analysis is not None and analysis.verdict is not None and analysis.verdict != phase.verdict:
        notes.append(_verdicts_differ_note(phase, analysis))
    examples = dataset_passes.steps * config.batch_size if dataset_passes.steps else None
    figures, what = _storage_figures(seen, alone, options, notes, data_bytes=data_bytes, examples=examples,
                                     config=config, parts=parts, phase=phase, private_pool=private_pool)
    advice = _dataset_advice(dataset, seen, phase, parts, config, warm, options, notes, examples=examples,
                             data_bytes=data_bytes, what=what if seen.remote_files else None)
    source = {"kind": "dataset", "path": _files_text(seen.files), "split": None, "examples": examples or "unknown",
              "files": len(seen.files), "bytes": data_bytes}
    if seen.under is not None:
        source["storage"] = differential.storage_summary(seen.under, alone.file_trips, alone.round_trips)
    return differential.Diagnosis(
        source=source,
        pipeline=config, accelerator=device_name, warm=warm, cold=alone.cold, pipeline_breakdown=parts,
        phases=(phase,), advice=tuple(differential.most_helpful_first(advice)), seconds=time.perf_counter() - started,
        notes=tuple(notes), analysis=analysis, stages=tuple(seen.chain), storage=figures, storage_whatif=what,
        reads=alone.reads,
    )


@dataclasses.dataclass(frozen=True)
class _Seen:
    """What the dataset's graph says of it, read once before any probe: every later step asks it."""

    graph: Any            # serialized once: its files, ops and reading stage are read from it
    ran: Any              # and once as TF runs it: its stages and maps' parallel calls
    chain: list[str]
    ops: set[str]
    served: bool          # distribute(): the pipeline runs on the service's workers
    files: list[str]
    in_store: list[str]   # the files in an object store, which every epoch reads again
    under: StorageUnder | None = None  # the storage the files are on (None: no files known)

    @property
    def on_network_fs(self) -> list[str]:
        """The files where they are on a network file system (every epoch reads them from it again)."""
        return self.files if self.under is not None and self.under.kind == "network-fs" else []

    @property
    def remote_files(self) -> list[str]:
        """The files in a store or on a network file system: read from afar, epoch after epoch."""
        return self.in_store or self.on_network_fs


@dataclasses.dataclass(frozen=True)
class _PipelineAlone:
    """The pipeline-alone probes: cold (None where not probed) and warm, the requests the warm one made
    through stallscope.read_files / read_records, and the store's round trip and bandwidth where timed."""

    cold: Any
    warm: Any
    requests: Any
    round_trips: Any
    bandwidth: Any
    reads: Any = None     # the records read alone where they are (`probes.ReadChain`), in a store or on a mount
    file_trips: Any = None  # a network file system's open and read, timed one file at a time (`storage.under`)
    server_cpu_ms_per_image: float = 0.0  # a FUSE mount's daemon on this host, measured over the warm probe


def _require_dataset(dataset) -> None:
    """Only a tf.data.Dataset has the graph every probe reads."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise UsageError(f"dataset: expected a tf.data.Dataset, got {type(dataset).__name__}")


def _read_dataset(dataset, options: DatasetDiagnoseOptions, notes: list[str]) -> _Seen:
    """The dataset's graph, its stages as TF runs them and its files (`options.files` where given), with a
    note where it has no batch stage, so an unbatched element is not silently taken for a batch."""
    graph = _graph(dataset)
    ran, chain = _as_run(dataset, notes)
    ops = _ops_in(graph)
    served = bool(ops & SERVICE_OPS)
    if chain and not served and not any(name.startswith(BATCH_STAGES) for name in chain):
        notes.append(f"the dataset has no batch stage ({' -> '.join(chain)}): each element is taken as one batch, "
                     "of as many examples as its first dimension; if that is an image's height, add "
                     ".batch(BATCH_SIZE) before diagnosing")
    files = list(options.files) if options.files is not None else _files_in(graph)
    under = storage_under(files[0]) if files else None
    return _Seen(graph, ran, chain, ops, served, files, in_store=[f for f in files if is_remote(f)], under=under)


def _probe_pipeline_alone(dataset, seen: _Seen, options: DatasetDiagnoseOptions, notes: list[str],
                          say) -> _PipelineAlone:
    """The pipeline without the model: cold where its files can be evicted, warm, and the storage's
    timing where the files are in a store or on a network file system (with its FUSE daemon's CPU)."""
    cold = _probe_cold(dataset, seen, options, notes, say)
    file_trips = None
    if seen.on_network_fs:  # as `diagnose` times it: one file at a time, nothing else in flight
        say(differential.FILE_TIMING_STEP)
        file_trips = time_file_round_trips(seen.on_network_fs)
    say("probe: pipeline alone, warm page cache")
    read_before = request_tally.snapshot()
    daemons = DaemonClock().start() if seen.on_network_fs and seen.under.fuse else None
    warm = probe_dataset(dataset, cache_state="warm", files=seen.files, max_batches=options.steps,
                         budget_s=options.pipeline_budget_s)
    requests = request_tally.snapshot().since(read_before)  # what stallscope.read_files / read_records asked for
    server_cpu = differential.daemon_cpu_per_image(daemons, warm.images, seen.under, notes) \
        if daemons is not None else 0.0
    round_trips = bandwidth = None
    if seen.in_store:
        say(TIMING_STEP)
        round_trips, bandwidth = time_store(seen.in_store)
    reads = _records_read_alone(seen, say) if seen.remote_files else None
    return _PipelineAlone(cold, warm, requests, round_trips, bandwidth, reads, file_trips, server_cpu)


def _records_read_alone(seen: _Seen, say):
    """The dataset's shards in a store or on a network file system read by one stream with no decode,
    by the reader its graph uses (TF's TFRecordDataset, else stallscope's), for READS_BUDGET_S: the chain
    a parallel decode sits behind (`storage_whatif.costs`' read_chain). None where it reads no records."""
    import tensorflow as tf

    from stallscope.analysis.dataset_storage import RECORD_OPS, source_format
    from stallscope.analysis.probes import time_record_reads
    from stallscope.analysis.storage_whatif import RECORD_READ_BUFFER_BYTES

    if source_format(seen.ops, seen.remote_files) != "records":
        return None
    say(differential.READS_STEP)
    if seen.ops & RECORD_OPS:
        records = tf.data.TFRecordDataset(seen.remote_files, buffer_size=RECORD_READ_BUFFER_BYTES)
    else:
        from stallscope.storage.own_pipeline import read_records

        records = read_records(seen.remote_files)
    return time_record_reads(records.repeat(), budget_s=differential.READS_BUDGET_S, max_records=MOST_RECORDS_ALONE)


MOST_RECORDS_ALONE = 100_000


def _probe_cold(dataset, seen: _Seen, options: DatasetDiagnoseOptions, notes: list[str], say):
    """The cold page-cache probe, only where there are local files to evict; else None, with a note of why."""
    if seen.in_store:
        notes.append(f"cold page cache not probed: the files are in a store ({seen.in_store[0]}), which every epoch "
                     "reads again, so the pipeline-alone probe already measures reads from it")
        return None
    if seen.on_network_fs:
        notes.append(f"cold page cache not probed: the files are on a network file system ({seen.under.label}), "
                     "which every epoch reads again, so the pipeline-alone probe already measures reads from it; "
                     "the local page-cache and I/O counters do not see those reads (storage per image has them)")
        return None
    if not seen.files:
        notes.append("cold page cache not probed: the dataset's graph names no files (a dataset built from "
                     "memory, or files= not given), so nothing could be evicted")
        return None
    say(f"probe: pipeline alone, cold page cache ({len(seen.files)} file(s) evicted)")
    return probe_dataset(dataset, cache_state="cold", files=seen.files, max_batches=options.steps,
                         budget_s=options.pipeline_budget_s)


def _probe_training(dataset, feed, take_step, seen: _Seen, dataset_passes: Passes, warm,
                    options: DatasetDiagnoseOptions, notes: list[str], say, *, per_step: int):
    """(compute, end_to_end, analysis): the step on cached batches, then on the dataset over a window
    that holds whole passes where a shuffle refills, then (options.profile) a few profiled steps."""
    say("probe: compute alone")
    cached = dataset.take(COMPUTE_CACHED_BATCHES).cache().repeat()
    compute = probe_loop("compute", "train", feed(cached), take_step, steps=options.steps, warmup=WARMUP_STEPS,
                         batches_per_step=per_step)
    say("probe: end to end")
    # a step of the loops is one call of fit's train function: `per_step` batches (steps_per_execution)
    stepped = _in_steps(dataset_passes, per_step)
    window = _window(stepped, options.steps, notes,
                     step_ms=compute.step_ms + warm.ms_per_batch * per_step, ms_per_element=warm.ms_per_image)
    end_to_end = probe_loop("end_to_end", "train", feed(dataset), take_step, steps=window, warmup=WARMUP_STEPS,
                            batches_per_step=per_step)
    record = pipeline_record(seen.graph, seen.ran) if seen.graph is not None and seen.ran is not None else None
    analysis = (_profiled_stage_tree(feed(dataset), take_step, notes, say, steps=_profiled_steps(window, stepped),
                                     record=record, work_dir=options.work_dir, per_step=per_step)
                if options.profile else None)
    return compute, end_to_end, analysis


def _dataset_advice(dataset, seen: _Seen, phase, parts, config: PipelineConfig, warm,
                    options: DatasetDiagnoseOptions, notes: list[str], *, examples: int | None, data_bytes: int,
                    what=None) -> list[Advice]:
    """`recommend`'s fixes less those the graph rules out, the reader's first where the step waits for
    input, priced (those that gain too little become notes) by the model of every figure of the report
    (the storage what-if of the store as read, `what`, for files in a store), and the tf.data service's
    where it pays."""
    advice = differential.recommend((phase,), config, parts, examples=examples or 0, data_bytes=data_bytes,
                                    warm=warm)
    advice = _fitting_the_graph(advice, seen)
    notes += _sequential_stateful_map_note(dataset, seen.graph, config)
    if phase.cause != "none":
        advice = reader_advice(seen.ops, seen.files, f"{fmt_share(phase.input_share, 0)} of the step waits for input, "
                                                     f"cause: {phase.cause}") + advice
    advice = _for_a_generator(advice, seen, phase, parts, config)
    advice, checked = differential.price_advice(advice, (phase,), parts, config, cores=differential.free_cores(warm),
                                                what=what, examples=examples or 0)
    notes += map(differential.checked_note, checked)
    if seen.served:  # what the workers do is theirs to change: only a prefetch after distribute() helps here
        notes.append(SERVED_NOTE)
        return [a for a in advice if a.key == "prefetch"]
    # the phase's figures are per batch already (`attribute`'s batches_per_step)
    service = service_advice(phase, parts, batch_size=config.batch_size, cores=differential.free_cores(warm),
                             bytes_per_element=element_bytes(dataset, config.batch_size), own_workload=False,
                             assumptions=options.service)
    return differential.with_service(advice, service, notes)


def _fitting_the_graph(advice: list[Advice], seen: _Seen) -> list[Advice]:
    """The advice less what the graph shows would change nothing: smaller images where none is decoded,
    one intra-op thread where there is no map."""
    if seen.graph is None or not decodes_images(seen.graph):  # no image decoded: smaller ones would not help
        advice = [a for a in advice if a.key != "max_side"]
    if seen.chain and not set(seen.chain) & set(MAP_STAGES):  # no map: nothing to run one intra-op thread per element
        advice = [a for a in advice if a.key != "outer_parallelism"]
    return advice


def _for_a_generator(advice: list[Advice], seen: _Seen, phase, parts, config: PipelineConfig) -> list[Advice]:
    """A generator source (from_generator, Python) has no files to read in parallel: the parallel reads
    advised for its wait become the generator's own parallelism, priced by `generators_priced`."""
    generator = next((name for name in seen.chain if name.startswith(GENERATOR_STAGES)), None)
    if not generator:
        return advice
    return [generators_priced(parallel_generator(generator, a.evidence), phase, parts, config)
            if a.key == "parallel_interleave" else a for a in advice]


def generators_priced(item: Advice, phase, parts, config: PipelineConfig) -> Advice:
    """N generators at once, N enough to overlap the wait measured per image (no core works through
    it: sleeps, remote calls, I/O) at most MOST_GENERATORS; their Python work still holds the GIL, so
    it counts once: an image every max((CPU + wait) / N, CPU) ms. The model's step with that pipeline."""
    cpu = parts.cpu_ms_per_image
    wait = parts.waiting_ms / config.batch_size
    if wait <= 0:
        return dataclasses.replace(item, gain_basis="not predicted: the generator does not wait, its Python work "
                                                    "holds the GIL; moving it into tf.data ops is outside the model")
    count = min(MOST_GENERATORS, max(2, math.ceil((cpu + wait) / max(cpu, 1e-9))))
    pipeline_ms = config.batch_size * max((cpu + wait) / count, cpu)
    predicted = whatif.predict(compute_ms=phase.compute_ms, pipeline_ms=pipeline_ms, batch_size=config.batch_size,
                               overlapped=differential.overlaps(phase, config))
    gain = differential.predicted_gain(phase, parts, predicted)
    step = differential.step_with_gain(phase, gain)
    return dataclasses.replace(
        item, code=f"N = {count}  # generators at once: enough to overlap the wait\n{item.code}",
        predicted_step_ms=step, predicted_gain=gain,
        gain_basis=f"{count} generators at once overlap its {wait:.1f} ms wait per image, its {cpu:.1f} ms of CPU "
                   f"holding the GIL: pipeline {parts.warm_ms:.1f} -> {pipeline_ms:.1f} ms per batch, step "
                   f"{phase.step_ms:.1f} -> {step:.1f} ms predicted")


MOST_GENERATORS = 8


def _sequential_stateful_map_note(dataset, graph, config: PipelineConfig) -> list[str]:
    """A note where TF's map_parallelization left a sequential map so because its function is stateful,
    so the user knows to parallelize it by hand (or use stateless ops)."""
    stateful = _stateful_map_ops(graph) if config.map_parallelism is None else []
    if not stateful or dataset.options().experimental_optimization.map_parallelization is False:
        return []
    return [f"TF's map_parallelization left a map sequential: its function holds a stateful op "
            f"({', '.join(stateful)}), and TF parallelizes only stateless ones; give it "
            "num_parallel_calls=tf.data.AUTOTUNE yourself, or use stateless ops (tf.random.stateless_uniform "
            "with a seed, tf.image.stateless_random_flip_left_right, ...)"]


def _storage_figures(seen: _Seen, alone: _PipelineAlone, options: DatasetDiagnoseOptions, notes: list[str], *,
                     data_bytes: int, examples: int | None, config: PipelineConfig, parts, phase, private_pool: int):
    """(figures, what-if) of the storage the dataset reads, where a store was named or the files are in
    one, on a network file system or read through stallscope's readers; else (None, None)."""
    if not (options.storage_scenarios or options.storage_client or seen.remote_files or alone.requests.requests):
        return None, None
    figures, what, more = dataset_storage(seen.ops, seen.files, data_bytes=data_bytes, examples=examples,
                                          config=config, warm=alone.warm, parts=parts, phase=phase,
                                          scenarios=options.storage_scenarios, client=options.storage_client,
                                          private_pool=private_pool, reads=_read_map_in(seen.graph),
                                          requests=alone.requests, round_trips=alone.round_trips,
                                          bandwidth=alone.bandwidth, records_alone=alone.reads,
                                          under=seen.under, file_trips=alone.file_trips,
                                          server_cpu_ms_per_image=alone.server_cpu_ms_per_image)
    notes += more
    return figures, what


def element_bytes(dataset, batch_size: int) -> float | None:
    """The bytes of one element as its tensors (what the service would ship uncompressed), from the
    element spec: a dimension TF does not know is taken as the batch size where it is the first, else
    unknown (None). Strings and ragged parts are unknown."""
    import tensorflow as tf

    total = 0.0
    for spec in tf.nest.flatten(dataset.element_spec):
        if not isinstance(spec, tf.TensorSpec) or spec.dtype == tf.string or spec.shape.rank is None:
            return None
        dims = list(spec.shape)
        if dims and dims[0] is None:
            dims[0] = batch_size
        if any(d is None for d in dims):
            return None
        total += math.prod(dims) * spec.dtype.size
    return total or None


def _verdicts_differ_note(phase, analysis) -> str:
    """The end-to-end probe and the profiled steps are two windows of the same pipeline; where their
    verdicts differ, the report says which one the headline is, and why they can differ."""
    note = (f"the profiled steps say {fmt_share(analysis.input_share)} ({analysis.verdict} input-bound), the "
            f"end-to-end probe {fmt_share(phase.input_share)} ({phase.verdict}): the verdict above is the probe's")
    if phase.step_ms < SHORT_STEP_MS:
        note += (f"; with steps of {phase.step_ms:.1f} ms a fraction of a millisecond of thread wake-up moves the "
                 "share by points, so more steps (steps=, --probe-steps) or a real model's step steady it")
    return note


def _is_file(name: str) -> bool:
    """A local file, or an object a store's listing holds (one listing per tree, kept for the process)."""
    return as_path(name).is_file() if is_remote(name) else os.path.isfile(name)


def _data_bytes(files: Sequence[str]) -> int:
    """The files' bytes; objects in a store from the listing that covers them, else from one listing of
    their common prefix (not a request per object)."""
    remote = [f for f in files if is_remote(f)]
    if remote and listed_size(as_path(remote[0])) is None:
        common = _common_prefix(remote)
        if common.count("/") >= 2 and common != remote[0]:  # at least scheme://bucket, and a folder
            as_path(common).is_dir()  # one listing, kept for the process
    total = 0
    for name in files:
        if not is_remote(name):
            total += os.path.getsize(name)
            continue
        try:
            total += as_path(name).stat().st_size
        except FileNotFoundError:
            logger.info("%s: not in its store's listing; its bytes are not counted", name)
    return total


def _common_prefix(urls: Sequence[str]) -> str:
    """The longest run of whole path segments the URLs share (`gs://b/x` of `gs://b/x/1`, `gs://b/x/2`)."""
    return "/".join(os.path.commonprefix([u.split("/") for u in urls]))


def _graph(dataset):
    """The dataset's GraphDef, its functions in `.library` (None where TF cannot serialize it)."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    try:
        serialized = tf.raw_ops.DatasetToGraphV2(input_dataset=dataset._variant_tensor,  # noqa: SLF001
                                                 external_state_policy=0, strip_device_assignment=True)
        graph.ParseFromString(serialized.numpy())
    except (tf.errors.OpError, ValueError) as exc:
        logger.warning("could not read the dataset's graph: %s", exc)
        return None
    return graph


def _graph_nodes(graph) -> list:
    """The nodes of the graph and of its functions (none without a graph)."""
    if graph is None:
        return []
    return list(graph.node) + [n for f in graph.library.function for n in f.node_def]


def read_map(dataset) -> ReadMap | None:
    """The stage that reads the dataset's files, as the storage what-if needs it (see `_read_map_in`)."""
    return _read_map_in(_graph(dataset))


def _read_map_in(graph) -> ReadMap | None:
    """A `stallscope.read_files` stage (named with its requests in flight), else the map whose function
    reads files (`tf.io.read_file`): its parallel calls (None: sequential; AUTOTUNE) and whether the same
    function decodes. None where no stage reads (a reader dataset, or data in memory)."""
    if graph is None:
        return None
    functions = {f.signature.name: {n.op for n in f.node_def} for f in graph.library.function}
    consts = {n.name: n for n in graph.node if n.op == "Const"}
    for node in graph.node:
        if node.op not in ("MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2"):
            continue
        name = given_name(node)
        if name.startswith(READ_STAGE) and name[len(READ_STAGE):].isdigit():
            return ReadMap(int(name[len(READ_STAGE):]), decodes=False)
        ops = functions.get(node.attr["f"].func.name, set())
        if "ReadFile" not in ops:
            continue
        calls = None
        if node.op != "MapDataset":
            const = consts.get(node.input[-1].split(":")[0])
            values = list(const.attr["value"].tensor.int64_val or const.attr["value"].tensor.int_val) if const else []
            calls = AUTOTUNE if not values or values[0] < 0 else int(values[0])
        return ReadMap(calls, any(op.startswith("Decode") for op in ops))
    return None


def graph_ops(dataset) -> set[str]:
    """The op types in the dataset's graph and functions (`ReadFile`, `TFRecordDatasetV2`, ...)."""
    return _ops_in(_graph(dataset))


def _ops_in(graph) -> set[str]:
    return {node.op for node in _graph_nodes(graph)}


def reader_advice(ops: set[str], files: Sequence[str], evidence: str) -> list[Advice]:
    """Where the files are in gs:// and TF's own client reads them one by one (a `tf.io.read_file` in
    the graph): stallscope's reader in its place, with kept-alive connections. Shards read by
    TFRecordDataset get none: 64 MB blocks in a few parallel reads already hide the latency
    (1,617-1,827 against 1,749-1,908 images/s through stallscope.read_records, benchmarks/own_pipeline.py)."""
    if not any(str(f).startswith("gs://") for f in files):
        return []
    advice = []
    if "ReadFile" in ops:
        advice.append(Advice(
            "read_files", "Read gs:// through stallscope.read_files", {},
            "dataset = stallscope.read_files(dataset, in_flight=64)  # (path, label) -> (bytes, label), in place of "
            "the tf.io.read_file map",
            "TF's gs:// opens a new TCP+TLS connection for every file, and its map keeps about one read per core in "
            "flight; stallscope's reader keeps its connections open and 64 requests in flight (on 2 cores at 10 ms "
            "per request: 55 -> 1,454-1,525 images/s, benchmarks/own_pipeline.py)", evidence))
    return advice


def dataset_files(dataset) -> list[str]:
    """The files the dataset reads, as far as its graph names them: string constants that are existing
    files, the files matching string constants that are glob patterns (`list_files`), and gs:// and
    s3:// objects (`stallscope.read_files` over a list of them; not asked of the store here)."""
    return _files_in(_graph(dataset))


def _files_in(graph) -> list[str]:
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    found: dict[str, None] = {}
    for node in _graph_nodes(graph):
        if node.op != "Const" or node.attr["dtype"].type != types_pb2.DT_STRING:
            continue
        try:  # string tensors may be packed in tensor_content, which make_ndarray cannot read
            proto = node.attr["value"].tensor.SerializeToString()
            values = np.asarray(tf.io.parse_tensor(proto, tf.string).numpy(), dtype=object).reshape(-1)
        except (tf.errors.OpError, ValueError):
            continue
        for raw in values[:MAX_FILES]:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            if is_remote(text) and not _GLOB_CHARS & set(text):
                found[text] = None
            elif os.path.isfile(text):
                found[os.path.abspath(text)] = None
            elif _GLOB_CHARS & set(text) and os.sep in text:
                for match in sorted(glob.glob(text)):
                    if os.path.isfile(match):
                        found[os.path.abspath(match)] = None
    return list(found)


_FROM_STAGES = object()  # config_from_chain's map parallelism: guessed from the stage names


def config_from_chain(chain: Sequence[str], *, batch_size: int, private_pool: int = 0,
                      shuffle: Passes | None = None, map_parallelism: Any = _FROM_STAGES) -> PipelineConfig:
    """The pipeline's knobs as far as its stages show them, so `recommend` advises only what is missing:
    a sequential map, no parallel read, no asynchronous stage at the end, a cache; as its options show them
    (`private_pool`: the threads of its private pool, 0 for TF's shared one); and its shuffle where it
    takes elements in again at each pass start (`shuffle`; after a map: of decoded elements), the one
    the advice acts on: a shuffle that keeps its buffer across passes costs nothing per pass. The maps'
    parallel calls as TF runs them (`map_parallelism`, see `_map_parallelism`), else as the stage names
    suggest (a MapAndBatch may be either: advised)."""
    stages = set(chain)
    shuffle = shuffle or Passes(None)
    if map_parallelism is _FROM_STAGES:
        map_parallelism = AUTOTUNE if "ParallelMap" in stages or not stages & set(MAP_STAGES) else None
    return PipelineConfig(
        preset="your dataset", batch_size=batch_size, shuffle_buffer=shuffle.shuffle_buffer if shuffle.refill else 0,
        shuffle_at="decoded" if shuffle.after_map else "encoded",
        # TF fuses no shuffle that refills with its repeat (`dataset_passes`): so `recommend` reads it
        shuffle_and_repeat_fusion=False if shuffle.refill else None,
        map_parallelism=map_parallelism,
        read_parallelism=AUTOTUNE if "ParallelInterleave" in stages else None,
        # any asynchronous last stage (a MapAndBatch, even of one call) makes the next batch while the step
        # runs, as a prefetch would
        prefetch=AUTOTUNE if chain and chain[0].startswith(ASYNC_PREFIXES) else None,
        cache="memory" if stages & {"Cache", "MemoryCache"} else "none", private_threadpool_size=private_pool,
    )


def _as_run(dataset, notes: list[str]) -> tuple[Any, list[str]]:
    """The dataset's graph after TF's rewrites and its stage chain; (None, []), with a note, where they
    cannot be read."""
    import tensorflow as tf

    try:
        ran = graph_as_run(dataset)
        return ran, chain_in(ran)
    except (ValueError, tf.errors.OpError) as exc:
        notes.append(f"the dataset's stages could not be read ({exc}); advice assumes a sequential pipeline")
        return None, []


def _passes_of(dataset, notes: list[str]) -> Passes:
    """`passes(dataset)`, or no pass length where the stages' own arguments cannot be read (they are
    TF's private attributes, which another TF version may name otherwise)."""
    import tensorflow as tf

    try:
        return passes(dataset)
    except (AttributeError, TypeError, ValueError, tf.errors.OpError) as exc:
        notes.append(f"the dataset's pass length and shuffle could not be read ({exc.__class__.__name__}: {exc}); "
                     "the end-to-end window is steps= long")
        return Passes(None)


def _stateful_map_ops(graph) -> list[str]:
    """The stateful ops (RandomUniform, a stateful py_function, ...) in the functions of the maps written
    sequential, also in the functions those call: TF's map_parallelization leaves such a map sequential."""
    from tensorflow.python.framework import op_def_registry

    if graph is None:
        return []
    functions = {f.signature.name: f for f in graph.library.function}
    found: set[str] = set()
    seen: set[str] = set()

    def visit(name: str) -> None:
        function = functions.get(name)
        if function is None or name in seen or not function.signature.is_stateful:
            return
        seen.add(name)
        for node in function.node_def:
            if "f" in node.attr and node.attr["f"].HasField("func"):
                visit(node.attr["f"].func.name)  # a call of another tf.function
            elif (op := op_def_registry.get(node.op)) is not None and op.is_stateful:
                found.add(node.op)

    for node in _graph_nodes(graph):
        if node.op == "MapDataset":
            visit(node.attr["f"].func.name)
    return sorted(found)


def _map_parallelism(ran, chain: Sequence[str]) -> Any:
    """The parallel calls of the maps the dataset runs, read from its graph after TF's rewrites (None:
    one runs sequentially; AUTOTUNE where there is no map, so nothing is advised); the stage names'
    guess where that graph could not be read."""
    if not set(chain) & set(MAP_STAGES):
        return AUTOTUNE
    return map_parallelism_in(ran) if ran is not None else _FROM_STAGES


def _device(model, accelerator: str):
    """(take_step, name, batches a step): the model's own train step on as many batches a step as its
    steps_per_execution, fetched inside the graph as fit does; or an emulated device, a batch a step."""
    if model is None:
        device = EmulatedDevice(parse_accelerator(accelerator))
        return eager_steps(device.run_step), device.accelerator.spec, 1
    import keras

    if not isinstance(model, keras.Model):
        raise UsageError(f"model: expected a keras.Model, got {type(model).__name__}")
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise UsageError("model: compile it first (model.compile(optimizer=..., loss=...)); the compute probe "
                         "trains it as fit would")
    return model_steps(model), f"model {model.name}", steps_per_execution(model)


def _in_steps(dataset_passes: Passes, per_step: int) -> Passes:
    """The passes counted in steps of `per_step` batches (steps_per_execution), as the loops step."""
    if per_step == 1 or dataset_passes.steps is None:
        return dataset_passes
    return dataclasses.replace(dataset_passes, steps=math.ceil(dataset_passes.steps / per_step))


def _profiled_stage_tree(dataset, take_step, notes: list[str], say, steps: int = PROFILED_STEPS,
                         record: dict | None = None, work_dir: Path | None = None, per_step: int = 1):
    """`steps` end-to-end steps with step markers, profiled and analysed: the stage tree and bottleneck,
    the CPU they used (resources.json beside the profile, as `stallscope.profile` writes it), and
    `record` (`describe.pipeline_record`: the stages as written and as run) as pipeline.json, so the
    analysis names TF's rewrites."""
    from stallscope.analysis.analyze import analyze_run
    from stallscope.errors import StallscopeError

    say(f"probe: end to end, profiled (stage tree, {steps} steps)")
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    # in work_dir: kept, for TensorBoard and `stallscope analyze`; else a temporary folder, removed below
    log_dir = Path(tempfile.mkdtemp(prefix="stallscope-diagnose-profile-", dir=work_dir))
    try:
        # in batches: the markers are numbered by a step's first batch
        profiler = StepProfiler(ProfileWindow(WARMUP_STEPS * per_step + 1, (WARMUP_STEPS + steps) * per_step), log_dir)
        with ResourceMonitor() as resources:
            probe_loop("profiled", "train", dataset, take_step, steps=steps, warmup=WARMUP_STEPS,
                       profiler=profiler, batches_per_step=per_step)
        rundir.write_json(log_dir, rundir.RESOURCES_NAME, resources.report.to_dict())
        if record is not None:
            rundir.write_json(log_dir, rundir.PIPELINE_NAME, record)
        try:
            analysis = analyze_run(log_dir, with_xprof=False)
        except StallscopeError as exc:
            notes.append(f"the profiled steps could not be analysed ({exc}); no stage tree")
            return None
    finally:
        if work_dir is None:
            shutil.rmtree(log_dir, ignore_errors=True)
    if work_dir is None:  # the figures stay; the paths say where the profile is not
        analysis = dataclasses.replace(analysis, source=PROFILE_NOT_KEPT, profile_path=PROFILE_NOT_KEPT, run_dir=None,
                                       captures=())
    return analysis


PROFILE_NOT_KEPT = "(not kept: diagnose without work_dir)"


def _profiled_steps(window: int, dataset_passes: Passes) -> int:
    """PROFILED_STEPS, or the end-to-end window where it holds whole passes over a shuffle that refills:
    a few steps between pass starts would show the shuffle serving from its full buffer and the map
    under it idle (960 steps of batches of 8 profile and analyse in 6 s here)."""
    per_pass = dataset_passes.steps
    whole = per_pass is not None and window % per_pass == 0
    return window if whole and dataset_passes.after_map and dataset_passes.refill else PROFILED_STEPS


def _window(dataset_passes: Passes, steps: int, notes: list[str], step_ms: float | None = None,
            ms_per_element: float | None = None) -> int:
    """The end-to-end probe's steps: whole passes over the data where a shuffle after a map takes in a
    tenth of a pass or more again as each pass starts (a window between pass starts is served from a
    full buffer), where a pass is affordable at `step_ms` a step (`differential.window_steps`); whole
    passes also where a pass is short; else `steps`, with a note of the refill the window leaves out
    (its time at `ms_per_element`, the pipeline's pace alone) where there is one or may be one."""
    per_pass, refill = dataset_passes.steps, dataset_passes.refill
    refills = dataset_passes.after_map and refill > 0
    took = f", about {refill * ms_per_element / 1000.0:.1f} s at the pipeline's pace alone" if ms_per_element else ""
    if refills and (per_pass is None or dataset_passes.elements is None):
        notes.append(f"how many elements a pass over the dataset holds is not known (a filter, a generator, records "
                     f"in a store), so the end-to-end window ({steps} steps) may hold no pass start, where its "
                     f"shuffle after a map takes in up to {refill:,} made elements again before its first{took}: the "
                     "input share leaves that wait out; `.apply(tf.data.experimental.assert_cardinality(N))` after "
                     "the stage that loses the count tells TF a pass's N elements, and shuffling before the map "
                     "removes the refill")
        return steps
    if per_pass is None:
        return steps
    refills = refills and dataset_passes.refill_share >= differential.REFILL_SHARE
    window = differential.window_steps(steps, per_pass, refills=refills, step_ms=step_ms)
    if refills and window % per_pass:
        notes.append(f"the end-to-end window ({window} steps) holds no start of a pass over the dataset "
                     f"({per_pass:,} batches), where its shuffle after a map takes in {refill:,} made elements "
                     f"again before its first{took}: the input share leaves that wait out; steps={per_pass} "
                     "measures a whole pass, and shuffling before the map removes the refill")
    return window


def _files_text(files: list[str]) -> str:
    if not files:
        return "(dataset in memory or files unknown)"
    if len(files) == 1:
        parent = files[0]
    elif any(is_remote(f) for f in files):  # commonpath would fold gs:// into gs:/
        parent = _common_prefix(files)
    else:
        parent = os.path.commonpath(files)
    return f"{parent} ({len(files)} file(s))"
