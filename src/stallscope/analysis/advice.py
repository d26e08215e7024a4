"""The fix, concrete for the analysed pipeline: which `PipelineConfig` knob to change, to what, and
the tf.data lines that do it, in the order that helps most (seed-004 and the tf.data guide):
parallel interleave over shards, parallel map, prefetch, cache, fewer bytes per image, more shards,
outer parallelism, tf.data service. Only advice that fits the evidence is given: a Python generator
source gets no file-reading advice, and steps that hold no input wait get a marker fix, not a verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from stallscope.analysis.fetch_wait import others_fill_the_cores
from stallscope.config import AUTOTUNE
from stallscope.cpu_limits import CpuLimits, quota_limited
from stallscope.errors import UsageError
from stallscope.pipeline.config import PipelineConfig
from stallscope.verdict import fmt_share

if TYPE_CHECKING:
    from stallscope.analysis.storage_whatif import StorageWhatIf

Analysis = Any  # an analyze.Analysis: analyze imports this module, so this one does not import analyze

ORDER = ("step_marker", "fetch_in_flight", "parallel_interleave", "parallel_generator", "parallel_map", "prefetch", "cache", "max_side",
         "more_shards", "outer_parallelism", "quota_pool", "data_service")
SOURCE_STAGES = ("TFRecord", "FlatMap", "Interleave", "ParallelInterleave", "TextLine", "FixedLengthRecord",
                 "ListFiles")   # stages that read files: shards, parallel reads and an encoded-bytes cache apply
GENERATOR_STAGES = ("Generator",)  # Dataset.from_generator: Python, one element at a time, under the GIL
MAP_STAGES = ("Map", "ParallelMap", "MapAndBatch")


@dataclasses.dataclass(frozen=True)
class Advice:
    """One change: `knobs` go to `PipelineConfig.replace(**knobs)`; empty when the fix is outside
    the pipeline config (re-converting the data, running a tf.data service)."""

    key: str
    title: str
    knobs: dict[str, Any]
    code: str
    reason: str
    evidence: str
    command: str = ""
    predicted_step_ms: float | None = None   # the what-if model's step time with this change alone
    predicted_gain: float | None = None      # step time now / predicted, less 1 (0.25: 25% faster); None: not predicted
    gain_basis: str = ""                     # the model's arithmetic, or why nothing was predicted
    sizing: Any = None                       # data_service: its service_sizing.ServiceSizing (the per-N what-if)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def recommend(analysis: "Analysis", config: PipelineConfig | None = None, cpu: dict[str, Any] | None = None) -> list[Advice]:
    """Every change that fits the evidence, each with its predicted gain (`fix_gain`), best first.
    The profile decides what is wrong; `config` (else the run's requested config) drops advice that
    would change nothing because its knobs are set already; `cpu` (resources.json's "cpu") tells
    whether a CPU quota held the run back. `split_by_gain` parts the fixes from the changes checked."""
    from stallscope.analysis import fix_gain

    config = config if config is not None else analysis.config
    tree = analysis.tree
    stage = tree.bottleneck_stage
    stage_names = [s.name for s in tree.stages]
    checks = {item.key: item for item in analysis.checklist}
    input_bound = analysis.input_bound
    no_prefetch = checks["prefetch_at_end"].answer == "no"
    cpu_saturated = checks["cpu_saturated"].answer == "yes"
    # the run's own CPU work is the limit only where it fills the cores (not other processes) and the wait
    # is not reads from a store (a latency-bound run waits with its process nearly idle)
    cpu_limits = cpu_saturated and not others_fill_the_cores(analysis.cpu_window) and analysis.fetch is None
    evidence = checks["bottleneck"].evidence
    base = _baseline(analysis, cpu_saturated)
    pool = quota_pool(config, cpus=(cpu or {}).get("cpus"), quota_cores=(cpu or {}).get("quota_cores"),
                      throttled_share=(cpu or {}).get("throttled_share"), evidence=checks["cpu_saturated"].evidence)
    if not input_bound:
        marker = [_step_marker(analysis)] if analysis.input_share is None and analysis.steps.between else []
        prefetch = [_gained(_prefetch(checks["prefetch_at_end"].evidence), base, fix_gain.with_prefetch)] \
            if no_prefetch and base is not None else []
        return _best_first([*marker, *prefetch, *([pool] if pool else [])])

    kind = _kind(stage) if stage is not None else "other"
    read_parallel = (config.read_parallelism is not None) if config else any(
        n.startswith("ParallelInterleave") for n in stage_names)
    map_parallel = (config.map_parallelism is not None) if config else any(
        n.startswith(("ParallelMap", "MapAndBatch")) for n in stage_names)
    cached = any(n.startswith(CACHE_STAGES) for n in stage_names)

    def parallel(item: Advice) -> Advice:
        return _gained(item, base, lambda b: fix_gain.with_parallel_stage(b, stage))

    def cached_away(item: Advice, what: str) -> Advice:
        return _gained(item, base, lambda b: fix_gain.without_stages(b, fix_gain.below(tree, stage), what))

    advice: list[Advice] = []
    if analysis.fetch is not None:
        fetching = _fetch_in_flight(analysis, stage, kind, config)
        if fetching is not None:
            advice.append(fetching)
    if kind == "source" and not read_parallel:
        advice.append(parallel(Advice(
            "parallel_interleave", "Read shards in parallel", {"read_parallelism": AUTOTUNE, "deterministic": False},
            "files = tf.data.Dataset.list_files(pattern, shuffle=True)\n"
            "dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=tf.data.AUTOTUNE,\n"
            "                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)",
            f"the source stage {stage.name} is the bottleneck and reads one file at a time", evidence)))
    if kind == "generator":
        advice.append(parallel(parallel_generator(stage.name, evidence, per_element_us=stage.per_element_us)))
    if kind == "map" and (not map_parallel or _underparallel(stage)):
        advice.append(parallel(Advice(
            "parallel_map", "Decode in parallel", {"map_parallelism": AUTOTUNE},
            "dataset = dataset.map(decode_and_resize, num_parallel_calls=tf.data.AUTOTUNE)",
            f"{stage.name} does its work one element at a time ({stage.per_element_us:.0f} us each)"
            if not stage.asynchronous else
            f"{stage.name} runs {stage.concurrency:.1f} calls at once (parallelism {stage.parallelism})",
            evidence)))
    if no_prefetch and base is not None:
        advice.append(_gained(_prefetch(checks["prefetch_at_end"].evidence), base, fix_gain.with_prefetch))
    if kind == "source" and not cached:
        advice.append(cached_away(Advice(
            "cache", "Cache the encoded bytes in memory", {"cache": "memory", "cache_at": "encoded"},
            "dataset = dataset.cache()  # after reading, before decoding; from the second epoch on, no I/O",
            "reading is the slow part; a cache serves every epoch after the first from memory", evidence),
            "from the second epoch on, no reading"))
    if kind == "generator" and not cached:
        advice.append(cached_away(Advice(
            "cache", "Cache the generator's elements (a generator that ends)", {},
            "dataset = dataset.cache().repeat()  # right after from_generator, before any random augmentation;\n"
            "# the generator must stop after one pass: an endless one (while True) never completes the cache",
            "the generator is the slow part; from the second epoch on a cache serves its elements from memory "
            "without running it, where they fit in memory and are the same every epoch. Only a generator that "
            "ends: the cache is complete only when its input ends, so an endless generator fills memory without "
            "bound and is never served from the cache; make it yield one pass and repeat after the cache",
            evidence), "from the second epoch on, the generator does not run"))
    if kind == "generator" and cached:
        advice.append(Advice(
            "cache", "Cache the generator's elements", {}, "", "the pipeline has a cache already", evidence,
            gain_basis="the pipeline caches already: the generator runs only in the epoch that fills the cache (the "
                       "one profiled here, if its wait is the generator's) and not after it, where the generator "
                       "ends; an endless generator never completes the cache"))
    if kind == "map" and (cpu_limits or map_parallel) and not cached and analysis.fetch is None:
        cpu_said = checks["cpu_saturated"].answer
        advice.append(cached_away(_decoded_cache(analysis, evidence, cpu_limits=cpu_limits, cpu_said=cpu_said),
                                  "from the second epoch on, no decoding"))
    if kind == "map" and analysis.decodes_images is not False:  # False: its dataset decodes no images
        advice.append(_max_side(analysis, stage, base, evidence))
    if kind == "source" and read_parallel:
        advice.append(parallel(Advice(
            "more_shards", "Split the data into more shards", {},
            "# more, smaller files let the interleave read more of them at once",
            f"{stage.name} is still the bottleneck with parallel reads: too few files to read at once",
            evidence, command="stallscope convert IMAGES --output_path RECORDS --shards 64")))
    if cpu_limits or (kind == "map" and map_parallel and analysis.fetch is None):
        advice.append(Advice(
            "outer_parallelism", "One intra-op thread per element", {"max_intra_op_parallelism": 1}, ONE_INTRA_OP_THREAD,
            "parallelism across elements is cheaper than inside each op (seed-004: +10% or more)",
            checks["cpu_saturated"].evidence, gain_basis="the what-if model has no term for intra-op threads: "
            "no gain is predicted"))
    if pool is not None:
        advice.append(pool)
    if cpu_limits and base is not None:
        advice.append(_data_service(analysis, base, checks["cpu_saturated"].evidence))
    if config is not None:
        advice = [a for a in advice if not a.knobs or any(getattr(config, k, None) != v for k, v in a.knobs.items())]
    return _best_first(advice)


def split_by_gain(advice: Sequence[Advice]) -> tuple[list[Advice], list[Advice]]:
    """(fixes, checked): a change the model predicts to gain under its least gain (`fix_gain.least_gain`),
    or predicts nothing for, is checked, not a fix; a marker fix and a quota's pool (which evens steps out) are fixes unpredicted."""
    from stallscope.analysis.fix_gain import least_gain

    fixes, checked = [], []
    for item in advice:
        keep = item.key in UNPREDICTED_FIXES or (item.predicted_gain is not None
                                                 and item.predicted_gain >= least_gain(item.key))
        (fixes if keep else checked).append(item)
    return fixes, checked


UNPREDICTED_FIXES = ("step_marker", "quota_pool")  # a measurement fix; steps evened out, not made shorter
CACHE_STAGES = ("MemoryCache", "Cache", "FileCache")


def _best_first(advice: list[Advice]) -> list[Advice]:
    """The marker fix first (nothing is measured without it), then by predicted gain in whole percent,
    then in seed-004's order."""
    def rank(item: Advice):
        gain = item.predicted_gain
        return (item.key != "step_marker", -round(gain * 100) if gain is not None else math.inf, ORDER.index(item.key))
    return sorted(advice, key=rank)


def _baseline(analysis: "Analysis", cpu_saturated: bool):
    """The what-if model's baseline for this analysis: idle cores over the steps from the CPU samples,
    else (a bare profile) assumed to be this machine's cores, said beside every gain."""
    from stallscope.analysis import fix_gain
    from stallscope.analysis.cpu_window import idle_cores
    from stallscope.cpu_limits import current

    idle = idle_cores(analysis.cpu_window, cpu_saturated)
    assumed = idle is None
    if assumed:
        idle = 0.0 if cpu_saturated else float(max(1, len(current().cpus) - 1))
    return fix_gain.baseline(analysis.steps, analysis.tree, idle_cores=idle, cores_assumed=assumed)


def _gained(item: Advice, base, predictor) -> Advice:
    """The advice with its predicted step time and gain; unpredicted where the share was not measured."""
    if base is None:
        return dataclasses.replace(item, gain_basis="not predicted: the input share was not measured")
    prediction, basis = predictor(base)
    return dataclasses.replace(item, predicted_step_ms=prediction.step_ms, predicted_gain=base.gain(prediction),
                               gain_basis=f"step {base.step_ms:.1f} -> {prediction.step_ms:.1f} ms: {basis}")


def _decoded_cache(analysis: "Analysis", evidence: str, *, cpu_limits: bool = True, cpu_said: str = "yes") -> Advice:
    """Decoded images cached after the map: the CPU decodes each image once, where they fit in memory.
    Its reason claims the CPU is the limit only where the CPU samples say so; without them it says what
    it assumes."""
    size = ""
    if analysis.examples and analysis.image_size:
        decoded = analysis.examples * analysis.image_size ** 2 * 3 * 4
        size = f" (here {analysis.examples:,} images x {analysis.image_size}x{analysis.image_size}x3 float32 = " \
               f"{decoded / 1e9:.2f} GB)"
    return Advice(
        "cache", "Cache the decoded images (where they fit in memory)", {"cache": "memory", "cache_at": "decoded"},
        "dataset = dataset.map(decode_and_resize, num_parallel_calls=tf.data.AUTOTUNE).cache()\n"
        "# random augmentation after the cache, so each epoch still differs",
        f"{_decoding_is_the_work(cpu_limits, cpu_said)}: a cache of the decoded images decodes each once; only "
        f"where they fit in memory{size}, else cache to a local file (cache('/local/ssd/decoded'))", evidence)


def _decoding_is_the_work(cpu_limits: bool, cpu_said: str) -> str:
    """No claim without its data: the CPU named as the limit only where its samples show it."""
    if cpu_limits:
        return "the CPU is the limit and decoding is its work"
    if cpu_said == "unknown":
        return ("assumed, with no CPU figures here: the map's decoding is the work that holds the run back (its "
                "own time is the walk's bottleneck)")
    return "the map's decoding is the work that holds the run back (its own time is the walk's bottleneck)"


def _fetch_in_flight(analysis: "Analysis", stage, kind: str, config: PipelineConfig | None) -> Advice | None:
    """A latency-bound run (analysis.fetch): enough reads in flight to hide the store's latency
    (latency x throughput), on threads that wait, not on cores. Priced on the headline's own steps."""
    from stallscope.analysis import whatif
    from stallscope.analysis.fetch_wait import reads_in_flight

    fetch = analysis.fetch
    batch = analysis.batch_size or (config.batch_size if config is not None else None)
    device = analysis.device_images_per_second
    run = analysis.run
    compute = run.compute_ms.mean if run is not None and run.compute_ms is not None else None
    if device is None and compute and batch:
        device = batch * 1000.0 / compute
    enough = reads_in_flight(fetch, device, batch)
    files = fetch.source_kind == "files" or (fetch.stage is not None and kind == "map")
    count = enough or 16
    knobs = {"read_parallelism": count, "deterministic": False, "private_threadpool_size": count + 2}
    where = "the map that reads each file" if files else "the pipeline"
    code = (f"dataset = paths.map(tf.io.read_file, num_parallel_calls={count}, deterministic=False)  # then decode"
            if files else
            f"dataset = files.interleave(tf.data.TFRecordDataset, cycle_length={count}, num_parallel_calls={count},\n"
            "                           deterministic=False)")
    code += (f"\noptions = tf.data.Options()\noptions.threading.private_threadpool_size = {count + 2}  "
             "# threads that wait on reads, not cores\ndataset = dataset.with_options(options)")
    sized = (f"latency x throughput: {fetch.request_ms:.1f} ms per request x {device:,.0f} images/s x "
             f"{fetch.requests_per_step / batch:.3g} requests per image = {count} in flight" if enough else
             f"{count} in flight, a guess: the store's request time or the device's pace is not known here")
    item = Advice("fetch_in_flight", f"Keep {count} reads in flight", knobs, code,
                  f"the run waits on the store's latency, not on CPU work: {where} asks for one file at a time; "
                  f"{sized}", fetch.text())
    fetching, wait = fetch.fetch_ms_per_step, fetch.wait_ms
    if run is None or compute is None or fetching is None or not batch:
        return dataclasses.replace(item, gain_basis="not predicted: the store's request times were not timed")
    pipeline = max(0.0, wait - fetching + fetching / count)
    now = run.step_ms.mean
    predicted = whatif.predict(compute_ms=compute, pipeline_ms=pipeline, batch_size=batch, overlapped=False)
    return dataclasses.replace(
        item, predicted_step_ms=predicted.step_ms, predicted_gain=now / predicted.step_ms - 1.0,
        gain_basis=(f"the run's own steps: step {now:.1f} -> {predicted.step_ms:.1f} ms: {fetching:.1f} ms of requests "
                    f"per step over {count} in flight -> input wait {pipeline:.1f} ms against compute {compute:.1f} ms"))


def _max_side(analysis: "Analysis", stage, base, evidence: str) -> Advice:
    """Smaller stored images, only where the stored ones exceed the model's input by 2x or more."""
    from stallscope.analysis import fix_gain
    from stallscope.analysis.stored_images import SHRINK_FROM, shrink_worth

    stored, size = analysis.stored, analysis.image_size
    worth = shrink_worth(stored, size)
    target = stored_side_for(size or 224)
    item = Advice(
        "max_side", "Store smaller images", {},
        f"# re-convert once; decoding a {target} px JPEG costs a fraction of a larger one (the pixels)",
        "decoding is the slow part and its cost grows with the pixels stored", evidence,
        command=f"stallscope convert IMAGES --output_path RECORDS --max-side {target}")
    if worth is None:
        return dataclasses.replace(item, gain_basis=(
            "not predicted: the stored images' size is not known here (stallscope's own runs record where they "
            f"are); it pays only where they exceed the model's input by {SHRINK_FROM:g}x or more"))
    if not worth:
        return dataclasses.replace(item, predicted_gain=0.0, gain_basis=(
            f"the stored images ({stored.side} px, median of {stored.sampled}) are under {SHRINK_FROM:g}x the "
            f"model's {size} px input: little to shrink"))
    item = dataclasses.replace(item, reason=f"{item.reason}: the stored images are {stored.side} px (median of "
                                            f"{stored.sampled}) for a {size} px input")
    return _gained(item, base, lambda b: fix_gain.with_smaller_images(b, stage, stored.side, target))


def stored_side_for(image_size: int) -> int:
    """The longer side to store for a model input: a little above it (room for a crop), in 32s: 224 -> 256."""
    return int(math.ceil(image_size * 8 / 7 / 32) * 32)


def _data_service(analysis: "Analysis", base, evidence: str) -> Advice:
    """More machines for the pipeline's CPU work, sized by the service model (`service_sizing`) from the
    profile: this host's pipeline CPU per batch (its step-long pipeline on the cores it kept busy), the
    decoded batch's bytes where the run's config says them, the compute alone as the device's pace."""
    from stallscope.analysis import service_sizing as sizing
    from stallscope.cpu_limits import current

    window = analysis.cpu_window
    host_cores = (window.cores if window is not None and window.cores else None) or float(len(current().cpus))
    busy = window.process_cores if window is not None and window.process_cores else host_cores
    per_step = max(1, analysis.steps.batches_per_step)
    config = analysis.config
    image_size = analysis.image_size or (config.image_size if config is not None else None)
    batch = config.batch_size if config is not None else None
    inputs = analysis.service.apply(sizing.ServiceInputs(  # the link and workers' cores where the user said them
        cpu_ms_per_element=max(base.pipeline_ms * busy / per_step, 1e-6),
        bytes_per_element=float(batch * sizing.decoded_image_bytes(image_size)) if batch and image_size else None,
        device_elements_per_second=per_step * 1000.0 / max(base.compute_ms, 1e-6),
        worker_cores=host_cores, trainer_cores=host_cores, images_per_element=batch or 1,
        local_elements_per_second=per_step * 1000.0 / base.step_ms))
    item = data_service_advice(sizing.size_service(inputs), evidence, own_workload=config is not None,
                               basis="this host's pipeline as profiled")

    def predictor(b):
        pace = item.sizing.ceiling.elements_per_second
        pipeline = per_step * 1000.0 / pace
        return b.predict(pipeline, overlapped=True), (
            f"{item.sizing.ceiling.workers} worker(s): {pace:,.1f} batches/s ({item.sizing.ceiling.bound}-bound) "
            f"-> pipeline {pipeline:.1f} ms per step against compute {b.compute_ms:.1f} ms")

    return _gained(item, base, predictor)


SERVICE_PORT = 5050


def data_service_advice(plan, evidence: str, *, own_workload: bool, basis: str) -> Advice:
    """The tf.data service advice from a `service_sizing.ServiceSizing` (`plan`): how many workers reach the
    device, what the link must carry, the compression to ask for, the code and the commands. The caller
    prices it (the sizing's ceiling is its prediction); `basis` says where the CPU per batch came from."""
    from stallscope.analysis import service_sizing as sizing

    inputs, ceiling = plan.inputs, plan.ceiling
    images = inputs.images_per_element
    unit = "images" if images > 1 else "elements"
    one = plan.worker_elements_per_second * images
    workers = ceiling.workers
    if plan.workers_needed is not None:
        title = f"Move preprocessing to {workers} tf.data service worker(s) of {inputs.worker_cores:g} cores"
        reach = f"{workers} reach the device's {inputs.device_elements_per_second * images:,.0f} {unit}/s"
    else:
        title = (f"Move preprocessing to {workers} tf.data service worker(s) of {inputs.worker_cores:g} cores "
                 f"(the {ceiling.bound} caps it)")
        reach = (f"the device takes {inputs.device_elements_per_second * images:,.0f} {unit}/s but the "
                 f"{'link' if ceiling.bound == 'link' else 'trainer receiving'} caps the service at "
                 f"{ceiling.images_per_second:,.0f}, which {workers} worker(s) reach")
    parts = [f"the cores here, all of them working in parallel, would still leave the step waiting for input: "
             f"one worker of {inputs.worker_cores:g} cores makes "
             f"{one:,.0f} {unit}/s ({inputs.cpu_ms_per_element:.1f} ms of CPU per element, {basis}, plus "
             f"sending it); {reach}"]
    shipped = plan.shipped_bytes_per_element
    if shipped is not None and ceiling.link_mb_per_second is not None:
        per_image = inputs.bytes_per_element / images
        parts.append(f"the link must carry {ceiling.link_mb_per_second:,.0f} MB/s "
                     f"({ceiling.link_mb_per_second * 8 / 1000:.2f} Gbit/s of {inputs.link_gbps:g}): the service ships "
                     f"decoded tensors, {per_image / 1024:,.0f} KiB per image, several times its JPEG (ship uint8 "
                     f"and cast on the trainer for a quarter of it); receiving costs the trainer "
                     f"{sizing.RECEIVE_MS_PER_MB:g} ms of CPU per MB")
    else:
        parts.append("the bytes per element are not known here, so the link and the trainer's receiving are not "
                     "sized: a decoded 224 px float32 image is 588 KiB")
    compressed = inputs.compression == "auto" and inputs.compression_ratio >= 1.2
    compression = "'AUTO'" if compressed else "None"
    parts.append(f"compression={compression}: snappy shrinks these elements {inputs.compression_ratio:.2f}x"
                 + (" and" if compressed else " but") + f" costs each worker {sizing.COMPRESS_MS_PER_MB:g} ms of "
                 "CPU per MB (TF's default is 'AUTO')")
    if plan.pays_off is False:
        parts.append(f"the service's ceiling ({ceiling.images_per_second:,.0f} {unit}/s) is below this host "
                     f"decoding alone ({inputs.local_elements_per_second * images:,.0f}): shipping decoded "
                     "images costs more than decoding them here; ship encoded bytes, or decode less")
    code = ("dataset = dataset.apply(tf.data.experimental.service.distribute(\n"
            "    processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,\n"
            f"    service='grpc://DISPATCHER:{SERVICE_PORT}', job_name='train',\n"
            f"    compression={compression}))  # before the final prefetch\n"
            "dataset = dataset.prefetch(tf.data.AUTOTUNE)\n"
            f"# or: stallscope.distribute(dataset, 'DISPATCHER:{SERVICE_PORT}', compression={compression})")
    command = (f"stallscope serve dispatcher --host 0.0.0.0 --port {SERVICE_PORT} --work-dir DIR; "
               f"stallscope serve worker --dispatcher DISPATCHER:{SERVICE_PORT} --host 0.0.0.0  "
               f"# on each of {workers} host(s)")
    if own_workload:
        command += f"; stallscope train --data-service DISPATCHER:{SERVICE_PORT}"
    return Advice("data_service", title, {}, code, "; ".join(parts), evidence, command=command, sizing=plan)


def apply_advice(config: PipelineConfig, advice: Advice | Iterable[Advice]) -> PipelineConfig:
    """The config with the advice's knobs set; advice without knobs (re-convert, service) is skipped."""
    items: Sequence[Advice] = [advice] if isinstance(advice, Advice) else list(advice)
    changes: dict[str, Any] = {}
    for item in items:
        changes.update(item.knobs)
    try:
        return config.replace(**changes)
    except TypeError as exc:
        raise UsageError(f"advice names a knob PipelineConfig does not have ({exc})") from None


def quota_pool(config: PipelineConfig | None, *, cpus: int | None, quota_cores: float | None,
               throttled_share: float | None, evidence: str) -> Advice | None:
    """A private pool of the CPU quota's whole cores, where a quota below the CPUs ran out and the
    pipeline runs on tf.data's shared pool, which TF sizes by the CPUs the process may run on, not by
    its quota: the pool `tuned` gets (presets.pool_for_quota), for any pipeline. None where it would
    change nothing (no quota, a quota never short, a pool already chosen). Without a config (a
    program's own profile: StallMonitor, stallscope.profile) the pool is not recorded, and the advice
    says it holds where none was set."""
    from stallscope.pipeline.presets import pool_for_quota

    if not cpus or not quota_cores or not quota_limited(throttled_share):
        return None
    known = config if config is not None else PipelineConfig()
    threads = pool_for_quota(known, CpuLimits(cpus=tuple(range(cpus)), quota_cores=quota_cores)).private_threadpool_size
    if threads == known.private_threadpool_size:
        return None
    unrecorded = "" if config is not None else " (where the pipeline sets no pool of its own: the profile does not say)"
    return Advice(
        "quota_pool", f"Size the pipeline's thread pool to the CPU quota: {threads} thread{'' if threads == 1 else 's'}",
        {"private_threadpool_size": threads},
        "options = tf.data.Options()\n"
        f"options.threading.private_threadpool_size = {threads}  # the CPU quota's whole cores\n"
        "dataset = dataset.with_options(options)",
        f"tf.data's shared pool has a thread per CPU this process may run on ({cpus}), not per CPU of its quota "
        f"({quota_cores:g}): its threads use up each period's quota early and wait out the rest, so steps "
        "alternate between fast and held back; a pool of the quota's cores gives the same images/s in even "
        f"steps (measured with a 1-CPU quota on 2 CPUs: 28 ms steps at the 90th percentile instead "
        f"of 58-60){unrecorded}", evidence)


def _prefetch(evidence: str) -> Advice:
    return Advice(
        "prefetch", "Prefetch at the end", {"prefetch": AUTOTUNE},
        "dataset = dataset.prefetch(tf.data.AUTOTUNE)  # the last line of the pipeline",
        "without a prefetch the next batch is made only when the step asks for it", evidence)


def _step_marker(analysis: "Analysis") -> Advice:
    """Steps that hold no input wait because the loop fetches its batch before the marker opens."""
    from stallscope.analysis.checklist import between_steps_text

    return Advice(
        "step_marker", "Fetch the batch inside the step marker", {},
        "iterator = iter(dataset)\n"
        "for i in range(steps):\n"
        "    with stallscope.step(i):  # or tf.profiler.experimental.Trace('train', step_num=i, _r=1)\n"
        "        x, y = next(iterator)\n"
        "        train_step(x, y)",
        "`for x, y in dataset:` fetches the batch before the step marker opens, so the steps hold no input wait "
        "and the input share cannot be measured; with next(iterator) inside the marker the wait is part of "
        "the step: profile again and analyze",
        f"IteratorGetNext outside the step markers: {between_steps_text(analysis.steps)}")


def parallel_generator(stage_name: str, evidence: str, per_element_us: float | None = None) -> Advice:
    """A Python generator source: no tf.data knob makes it parallel; its work must move or multiply
    (the profile's stage, or `stallscope.diagnose`'s dataset whose source is one)."""
    each = f" ({per_element_us:.0f} us each)" if per_element_us is not None else ""
    return Advice(
        "parallel_generator", "Move the generator's work into tf.data ops, or run several generators at once", {},
        "# best: the same work as tf.data ops, which run in parallel outside the GIL\n"
        "dataset = tf.data.Dataset.from_tensor_slices(items).map(load, num_parallel_calls=tf.data.AUTOTUNE)\n"
        "# else: N generators at once, each making its own share of the elements (gen(i, n)), on a pool\n"
        "# of their own (AUTOTUNE on tf.data's shared pool keeps about one call per core in flight)\n"
        "dataset = tf.data.Dataset.range(N).interleave(\n"
        "    lambda i: tf.data.Dataset.from_generator(gen, output_signature=SIGNATURE, args=(i, N)),\n"
        "    cycle_length=N, num_parallel_calls=N, deterministic=False)\n"
        "options = tf.data.Options()\n"
        "options.threading.private_threadpool_size = N + os.cpu_count()\n"
        "dataset = dataset.with_options(options)",
        f"the source stage {stage_name} is a Python generator: it makes one element at a time{each} "
        "under Python's GIL, and no parallelism setting of tf.data reaches "
        "inside it; several generators at once help where it waits (I/O, sleeps, C code that releases the GIL), "
        "pure-Python work only as tf.data ops or records read by a parallel interleave", evidence)


def _kind(stage) -> str:
    """map, source or generator: which advice fits the stage (tf.distribute's per-device feed: none)."""
    name = stage.name
    if getattr(stage, "device_feed", False):
        return "other"
    if name.startswith(MAP_STAGES):
        return "map"
    if name.startswith(SOURCE_STAGES):
        return "source"
    if name.startswith(GENERATOR_STAGES):
        return "generator"
    return "other"


def reads_files(stage) -> bool:
    """A stage whose work includes reading: a source, or a map (the seed pipeline's map reads each file)."""
    return _kind(stage) in ("map", "source")


def _underparallel(stage) -> bool:
    """A parallel map with a fixed, low parallelism that stays the bottleneck (one AUTOTUNE tunes is not:
    TF's map_parallelization rewrite makes a user's sequential map one, tuned to the cores there are)."""
    if not stage.asynchronous:
        return True
    return (not stage.autotuned and stage.parallelism is not None and stage.parallelism != AUTOTUNE
            and stage.parallelism < 4)


ONE_INTRA_OP_THREAD = ("options = tf.data.Options()\noptions.threading.max_intra_op_parallelism = 1\n"
                       "dataset = dataset.with_options(options)")
CACHE_MEMORY_FRACTION = 0.25  # advise an in-memory cache only for data below this share of free RAM
STORAGE_ORDER = ("convert_records", "gcs_block_size", "gcs_reader", "reads_in_flight", "cache", "connection_reuse")
STORAGE_GAIN = 1.1          # advise a storage change only where the what-if gains at least 10%
RECORDS_GAIN = 1.25         # advise converting to records from a 25% gain (a conversion costs a pass)
S3_POOL_CONNECTIONS = 10    # aiobotocore's default max_pool_connections, under s3fs


def storage_advice(what: "StorageWhatIf", config: PipelineConfig, *, data_bytes: int, memory_bytes: float,
                   local_images_per_second: float, dataset_path: str = "DATA") -> list[Advice]:
    """The storage fixes, where the what-if at a store the user named shows storage dominating the
    pipeline as configured (input-bound, limited by requests, bandwidth or the client's CPU rather than
    decoding): records
    instead of files, enough reads in flight on a private pool (latency x throughput), TF's GCS
    block size, caching the first epoch, and connection reuse where the client has a pool."""
    dominated = _most_storage_dominated(what, config)
    if dominated is None:
        return []
    row, current, cell = dominated
    scenario = row.scenario
    evidence = _storage_evidence(scenario.label, current, cell)
    records = _convert_records(row, current, cell, config, evidence, dataset_path)
    reading, cell, block_size = _smaller_gcs_block(current, cell, scenario, config, what, evidence)
    enough = reading.enough_in_flight
    pooled = _pooled_gcs_reads(current, config, what, scenario, cell, enough)
    reads = (_gcs_reader(current, config, pooled, cell, enough, evidence) if pooled is not None
             else _reads_in_flight(config, reading, cell, enough, evidence))
    cache = _first_epoch_cache(config, data_bytes, memory_bytes, local_images_per_second, evidence)
    reuse = _connection_reuse(current, enough, pooled, evidence)
    advice = [a for a in (records, block_size, reads, cache, reuse) if a is not None]
    advice = [a for a in advice if not a.knobs or any(getattr(config, k, None) != v for k, v in a.knobs.items())]
    return sorted(advice, key=lambda a: STORAGE_ORDER.index(a.key))


def _most_storage_dominated(what: "StorageWhatIf", config: PipelineConfig):
    """(row, its current format, its cell as configured) of the named scenario whose input share is the
    largest among those where storage limits an input-bound pipeline; None where none does."""
    from stallscope.analysis import storage_whatif as sw

    dominated = []
    for row in what.scenarios:
        if not row.named:
            continue
        current = row.format(what.source_format)
        cell = sw.as_configured(current, config)
        if cell.prediction.verdict != "not" and cell.bound in sw.STORAGE_BOUNDS:
            dominated.append((cell.prediction.input_share, row, current, cell))
    if not dominated:
        return None
    _, row, current, cell = max(dominated, key=lambda item: item[0])
    return row, current, cell


def _storage_evidence(label: str, current, cell) -> str:
    """What every storage fix rests on: the store, the format and client, and what they give as configured."""
    return (f"at {label}, {current.format} through {current.client} ({current.basis}: "
            f"{current.requests_per_image:.3g} requests per image): {cell.reads} give "
            f"{cell.images_per_second:,.0f} images/s, {fmt_share(cell.prediction.input_share, 0)} of the step "
            f"waits for input, limited by {cell.bound}")


def _convert_records(row, current, cell, config: PipelineConfig, evidence: str, dataset_path: str) -> Advice | None:
    """Image files converted to records, where the records' fewer requests gain RECORDS_GAIN (a
    conversion costs a pass over the data); else None."""
    from stallscope.analysis import storage_whatif as sw

    if current.format != "files":
        return None
    records = sw.as_configured(row.format("records"), config)
    if not records.images_per_second >= RECORDS_GAIN * cell.images_per_second:
        return None
    return Advice(
        "convert_records", "Convert the images to TFRecord shards", {},
        "# one ranged GET per block of a 50 MiB shard instead of one request per image",
        f"records need {row.format('records').requests_per_image:.3g} requests per image instead of "
        f"{current.requests_per_image:.3g}: {records.images_per_second:,.0f} images/s "
        f"({fmt_share(records.prediction.input_share, 0)} input) instead of {cell.images_per_second:,.0f}",
        evidence,
        command=f"stallscope convert --dataset_path {dataset_path} --output_path RECORDS, then "
                f"--source records --dataset_path RECORDS",
        predicted_gain=records.images_per_second / cell.images_per_second - 1.0 if cell.images_per_second > 0 else None,
        gain_basis=f"the storage what-if at {row.scenario.label}: {cell.images_per_second:,.0f} -> "
                   f"{records.images_per_second:,.0f} images/s as configured")


def _smaller_gcs_block(current, cell, scenario, config: PipelineConfig, what: "StorageWhatIf", evidence: str):
    """(reading, cell, advice): TF's gs:// with a 1 MB read block where that gains STORAGE_GAIN, as
    configured or with the reads in flight advised after it, which are then sized for 1 MB blocks;
    else the current reading and cell, and no advice."""
    from stallscope.analysis import storage_whatif as sw

    if current.client != "tf-gcs":
        return current, cell, None
    block_mb = sw.tf_gcs_client().block_bytes / sw.MIB
    if block_mb <= 1:  # pays where a shard is read in pieces and is smaller than the block
        return current, cell, None
    small = sw.predict_format(
        sw.IoPattern(current.format, current.bytes_per_image, current.objects_per_image), scenario,
        sw.tf_gcs_client(1), config, what.workload)
    better = sw.as_configured(small, config)
    best_now = max(cell.images_per_second, current.enough_in_flight.images_per_second)
    best_small = max(better.images_per_second, small.enough_in_flight.images_per_second)
    if not best_small >= STORAGE_GAIN * best_now:  # as configured, or with the reads in flight advised below
        return current, cell, None
    return small, better, Advice(
        "gcs_block_size", "Shrink TF's GCS read block to 1 MB", {},
        f"os.environ['{sw.GCS_BLOCK_ENV}'] = '1'  # before TensorFlow opens the first gs:// file",
        f"TF's gs:// gives every ranged GET of a shard a {block_mb:g} MB buffer (~{0.711 * block_mb:.0f} ms "
        f"of CPU, tensorflow/tensorflow#30327), whatever the shard holds; at 1 MB: up to "
        f"{best_small:,.0f} images/s instead of {best_now:,.0f}", evidence,
        command=f"{sw.GCS_BLOCK_ENV}=1 stallscope train ...",
        predicted_gain=best_small / best_now - 1.0 if best_now > 0 else None,
        gain_basis=f"the storage what-if at {scenario.label}: {best_now:,.0f} -> {best_small:,.0f} images/s, "
                   "as configured or with the reads in flight advised")


def _gcs_reader(current, config: PipelineConfig, pooled, cell, enough, evidence: str) -> Advice:
    """stallscope's pooled gs:// reader with `pooled`'s reads in flight: kept-alive connections instead
    of a handshake per request."""
    return Advice(
        "gcs_reader", "Read gs:// over kept-alive connections (stallscope's pooled reader)",
        {"gcs_reader": "pooled", "read_parallelism": pooled.read_parallelism,
         "private_threadpool_size": pooled.private_threadpool_size, "deterministic": False,
         **({"map_parallelism": AUTOTUNE} if config.map_parallelism is None else {}),
         **({"prefetch": AUTOTUNE} if config.prefetch is None else {})},
        "# obstore (Rust object_store) keeps its TLS connections; TF's gs:// opens one per request\n"
        "store = obstore.store.GCSStore(BUCKET)\n"
        "data = [bytes(obstore.get(store, key).bytes()) for key in group]  # on a pool of request threads",
        f"TF's gs:// pays a TCP+TLS handshake with every request ({current.connections_per_image:.3g} "
        f"connections per image); {pooled.reads}, over kept-alive connections: "
        f"{pooled.images_per_second:,.0f} images/s ({fmt_share(pooled.prediction.input_share, 0)} input) "
        "instead of "
        f"{max(cell.images_per_second, enough.images_per_second):,.0f}", evidence)


def _reads_in_flight(config: PipelineConfig, reading, cell, enough, evidence: str) -> Advice | None:
    """Enough reads in flight on a private pool (latency x throughput), where requests limit the
    reading and enough of them gain STORAGE_GAIN; else None."""
    if not (cell.bound == "requests" and enough.images_per_second >= STORAGE_GAIN * cell.images_per_second):
        return None
    knobs: dict[str, Any] = {"read_parallelism": enough.read_parallelism,
                             "private_threadpool_size": enough.private_threadpool_size, "deterministic": False}
    if config.map_parallelism is None:
        knobs["map_parallelism"] = AUTOTUNE
    if config.prefetch is None:
        knobs["prefetch"] = AUTOTUNE
    wait = reading.costs.wait_ms / max(reading.requests_per_image, 1e-12)
    return Advice(
        "reads_in_flight", f"Keep {enough.read_parallelism} reads in flight on a private thread pool", knobs,
        "options = tf.data.Options()\n"
        f"options.threading.private_threadpool_size = {enough.private_threadpool_size}\n"
        f"dataset = files.interleave(read_one, cycle_length={enough.read_parallelism},\n"
        f"                           num_parallel_calls={enough.read_parallelism}, deterministic=False)\n"
        "dataset = dataset.with_options(options)",
        f"{cell.in_flight:.1f} requests in flight ({cell.reads}) wait {wait:.1f} ms each; latency x throughput = "
        f"{wait:.1f} ms x {enough.images_per_second * reading.requests_per_image:,.0f} requests/s needs "
        f"{enough.read_parallelism} in flight, and a pool of {enough.private_threadpool_size} threads (reads + "
        f"decode; the shared pool has one per core): {enough.images_per_second:,.0f} images/s "
        f"({fmt_share(enough.prediction.input_share, 0)} input)", evidence)


def _first_epoch_cache(config: PipelineConfig, data_bytes: int, memory_bytes: float,
                       local_images_per_second: float, evidence: str) -> Advice | None:
    """A cache of the first epoch's bytes where the pipeline has none: in memory where the data is under
    CACHE_MEMORY_FRACTION of it, else on local disk; None where it caches already."""
    if config.cache != "none":
        return None
    fits = data_bytes < memory_bytes * CACHE_MEMORY_FRACTION
    return Advice(
        "cache", "Cache the first epoch's bytes" + (" in memory" if fits else " on local disk"),
        {"cache": "memory", "cache_at": "encoded"} if fits else {},
        "dataset = dataset.cache(" + ("" if fits else "'/local/ssd/stallscope-cache'")
        + ")  # after reading, before decoding",
        f"only the first epoch pays the store; later epochs read locally at about "
        f"{local_images_per_second:,.0f} images/s (the data: {data_bytes / 1e6:,.0f} MB)", evidence,
        command="" if fits else "--cache file --cache-path /local/ssd/stallscope-cache")


def _connection_reuse(current, enough, pooled, evidence: str) -> Advice | None:
    """A larger S3 pool where more reads are in flight than s3fs keeps connections for; or, for image
    files through TF's gs:// with no pooled reader advised, fewer requests (it opens one per request)."""
    from stallscope.analysis import storage_whatif as sw

    if not sw.client_named(current.client).new_connection_per_request and current.client == "s3fs" and \
            enough.read_parallelism and enough.read_parallelism > S3_POOL_CONNECTIONS:
        return Advice(
            "connection_reuse", f"Let the S3 client pool {enough.read_parallelism} connections", {},
            f"s3fs.S3FileSystem(config_kwargs={{'max_pool_connections': {enough.read_parallelism}}})",
            f"{enough.read_parallelism} reads in flight over aiobotocore's default pool of {S3_POOL_CONNECTIONS} "
            "connections would open and close the rest per request", evidence)
    if current.client == "tf-gcs" and current.format == "files" and pooled is None:
        return Advice(
            "connection_reuse", "Fewer requests: TF's gs:// opens a connection per request", {},
            "# TF's gs:// has no connection pool: every request pays a TCP+TLS handshake (~4 round trips)",
            f"{current.connections_per_image:.3g} connections per image; records cut them with the requests, "
            "and an fsspec reader (gcsfs, s3fs) keeps a pool", evidence)
    return None


def _pooled_gcs_reads(current, config: PipelineConfig, what: "StorageWhatIf", scenario, cell, enough):
    """JPEGs read through TF's gs:// (a connection per request): the pooled reader's cell with enough
    reads in flight, where obstore is installed and it gains STORAGE_GAIN over the best TF's client
    gives (as configured, or with enough reads in flight); else None."""
    from stallscope.analysis import storage_whatif as sw
    from stallscope.storage import gcs_obstore

    if current.client != "tf-gcs" or current.format != "files" or not gcs_obstore.available():
        return None
    row = sw.predict_format(sw.IoPattern(current.format, current.bytes_per_image, current.objects_per_image),
                            scenario, sw.obstore_gcs_client(), config.replace(gcs_reader="pooled"), what.workload)
    pooled = row.enough_in_flight
    best_now = max(cell.images_per_second, enough.images_per_second)
    return pooled if pooled.images_per_second >= STORAGE_GAIN * best_now else None


def merge_advice(local: Sequence[Advice], storage: Sequence[Advice]) -> list[Advice]:
    """The diagnosis' own advice and the storage advice, storage's version winning where both
    touch the same thing (its cache; its reads in flight replace a plain parallel interleave and its
    pool, sized for reads plus the cores, the quota's pool)."""
    keys = {a.key for a in storage}
    drop = keys | ({"parallel_interleave"} if keys & {"reads_in_flight", "gcs_reader"} else set())
    if any("private_threadpool_size" in a.knobs for a in storage):
        drop.add("quota_pool")  # the storage pool holds threads that wait on reads: the quota's cores are too few
    return [*storage, *(a for a in local if a.key not in drop)]
