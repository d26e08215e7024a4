"""The fix, concrete for the analysed pipeline: which `PipelineConfig` knob to change, to what, and
the tf.data lines that do it, in the order that helps most (seed-004 and the tf.data guide):
parallel interleave over shards, parallel map, prefetch, cache, fewer bytes per image, more shards,
outer parallelism, tf.data service. Only advice that fits the evidence is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from stallscope.config import AUTOTUNE
from stallscope.errors import UsageError
from stallscope.pipeline.config import PipelineConfig

if TYPE_CHECKING:
    from stallscope.analysis.analyze import Analysis

ORDER = ("parallel_interleave", "parallel_map", "prefetch", "cache", "max_side", "more_shards",
         "outer_parallelism", "data_service")
SOURCE_STAGES = ("TFRecord", "FlatMap", "Interleave", "ParallelInterleave", "TextLine", "FixedLengthRecord",
                 "Generator", "ListFiles", "TensorSlice", "Range", "Zip")
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def recommend(analysis: "Analysis", config: PipelineConfig | None = None) -> list[Advice]:
    """Advice for this analysis, best first. The profile decides what is wrong; `config` (else the
    run's requested config) drops advice that would change nothing because its knobs are set already."""
    config = config if config is not None else analysis.config
    tree = analysis.tree
    stage = tree.bottleneck_stage
    stage_names = [s.name for s in tree.stages]
    checks = {item.key: item for item in analysis.checklist}
    input_bound = analysis.input_bound
    no_prefetch = checks["prefetch_at_end"].answer == "no"
    cpu_saturated = checks["cpu_saturated"].answer == "yes"
    evidence = checks["bottleneck"].evidence
    if not input_bound:
        return [_prefetch(checks["prefetch_at_end"].evidence)] if no_prefetch else []

    kind = _kind(stage.name) if stage is not None else "other"
    read_parallel = (config.read_parallelism is not None) if config else any(
        n.startswith("ParallelInterleave") for n in stage_names)
    map_parallel = (config.map_parallelism is not None) if config else any(
        n.startswith(("ParallelMap", "MapAndBatch")) for n in stage_names)
    advice: list[Advice] = []
    if kind == "source" and not read_parallel:
        advice.append(Advice(
            "parallel_interleave", "Read shards in parallel", {"read_parallelism": AUTOTUNE, "deterministic": False},
            "files = tf.data.Dataset.list_files(pattern, shuffle=True)\n"
            "dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=tf.data.AUTOTUNE,\n"
            "                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)",
            f"the source stage {stage.name} is the bottleneck and reads one file at a time", evidence))
    if kind == "map" and (not map_parallel or _underparallel(stage)):
        advice.append(Advice(
            "parallel_map", "Decode in parallel", {"map_parallelism": AUTOTUNE},
            "dataset = dataset.map(decode_and_resize, num_parallel_calls=tf.data.AUTOTUNE)",
            f"{stage.name} does its work one element at a time ({stage.per_element_us:.0f} us each)"
            if not stage.asynchronous else
            f"{stage.name} runs {stage.concurrency:.1f} calls at once (parallelism {stage.parallelism})",
            evidence))
    if no_prefetch:
        advice.append(_prefetch(checks["prefetch_at_end"].evidence))
    if kind == "source":
        advice.append(Advice(
            "cache", "Cache the encoded bytes in memory", {"cache": "memory", "cache_at": "encoded"},
            "dataset = dataset.cache()  # after reading, before decoding; from the second epoch on, no I/O",
            "reading is the slow part; a cache serves every epoch after the first from memory", evidence))
    if kind == "map":
        advice.append(Advice(
            "max_side", "Store smaller images", {},
            "# re-convert once; decoding a 256 px JPEG costs a fraction of a 500 px one",
            "decoding is the slow part and its cost grows with the pixels stored", evidence,
            command="stallscope convert IMAGES --output_path RECORDS --max-side 256"))
    if kind == "source" and read_parallel:
        advice.append(Advice(
            "more_shards", "Split the data into more shards", {},
            "# more, smaller files let the interleave read more of them at once",
            f"{stage.name} is still the bottleneck with parallel reads: too few files to read at once",
            evidence, command="stallscope convert IMAGES --output_path RECORDS --shards 64"))
    if cpu_saturated or (kind == "map" and map_parallel):
        advice.append(Advice(
            "outer_parallelism", "One intra-op thread per element", {"max_intra_op_parallelism": 1},
            "options = tf.data.Options()\noptions.threading.max_intra_op_parallelism = 1\n"
            "dataset = dataset.with_options(options)",
            "parallelism across elements is cheaper than inside each op (seed-004: +10% or more)",
            checks["cpu_saturated"].evidence))
    if cpu_saturated:
        advice.append(Advice(
            "data_service", "Move preprocessing to more machines (tf.data service)", {},
            "dataset = dataset.apply(tf.data.experimental.service.distribute(\n"
            "    processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,\n"
            "    service='grpc://DISPATCHER:5050'))  # before the final prefetch",
            "every core here is busy; more CPUs are the remaining fix", checks["cpu_saturated"].evidence,
            command="stallscope serve worker --dispatcher DISPATCHER:5050  # on each extra host, then "
                    "train --data-service DISPATCHER:5050"))
    if config is not None:
        advice = [a for a in advice if not a.knobs or any(getattr(config, k, None) != v for k, v in a.knobs.items())]
    return sorted(advice, key=lambda a: ORDER.index(a.key))


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


def _prefetch(evidence: str) -> Advice:
    return Advice(
        "prefetch", "Prefetch at the end", {"prefetch": AUTOTUNE},
        "dataset = dataset.prefetch(tf.data.AUTOTUNE)  # the last line of the pipeline",
        "without a prefetch the next batch is made only when the step asks for it", evidence)


def _kind(name: str) -> str:
    if name.startswith(MAP_STAGES):
        return "map"
    if name.startswith(SOURCE_STAGES):
        return "source"
    return "other"


def _underparallel(stage) -> bool:
    """A parallel map with a fixed, low parallelism that stays the bottleneck."""
    if not stage.asynchronous:
        return True
    return stage.parallelism is not None and stage.parallelism != AUTOTUNE and stage.parallelism < 4
