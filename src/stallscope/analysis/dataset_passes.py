"""How a dataset of your own passes over its data: the steps of one pass, also through a `repeat`, and
the elements a shuffle takes in again as each pass starts, before its first output.

`stallscope.diagnose` needs both to choose its end-to-end window: a window between two pass starts is
served from a full shuffle buffer and leaves the refill's wait out. They are read from the dataset's
chain of Python dataset objects (each stage keeps its input and its arguments), which holds what the
serialized graph does not: the cardinality of the data under a `repeat`. Where TF knows no length (a
reader of TFRecords: TF's or `stallscope.read_records`), the records of the shards it reads are
counted (`records.record_count`).
"""

from __future__ import annotations

import dataclasses
import math

from stallscope.pipeline.describe import given_name
from stallscope.records.record_count import count_records
from stallscope.storage.s3_request_plan import RECORDS_STAGE

# Stages that give one element for each element they take: a pass is as many of their outputs as inputs.
_ONE_FOR_ONE = frozenset({
    "_MapDataset", "_ParallelMapDataset", "_PrefetchDataset", "_OptionsDataset", "_ShuffleDataset", "CacheDataset",
    "_CacheDataset", "_AssertCardinalityDataset", "_TakeDataset", "_SkipDataset", "_IgnoreErrorsDataset",
    "_ModelDataset", "_OptimizeDataset", "_MapWithLegacyFunctionDataset",
})
_CACHES = frozenset({"CacheDataset", "_CacheDataset"})
# Stages that give one element for `_batch_size` elements they take.
_BATCHES = frozenset({"_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset"})
# Stages whose elements cost work to make (a map decodes, parses, augments): a shuffle above one holds made
# elements, so its refill redoes that work; a shuffle of file names or records refills at almost no cost.
_MAPS = frozenset({"_MapDataset", "_ParallelMapDataset", "_MapWithLegacyFunctionDataset"})
# One-for-one stages that also keep a pass's count (a take or skip changes it).
_SAME_COUNT = _ONE_FOR_ONE - {"_TakeDataset", "_SkipDataset"}
# Stages whose function opens a reader on each file name they take (`_reads_records` says which read records).
_INTERLEAVES = frozenset({"_InterleaveDataset", "_ParallelInterleaveDataset", "_FlatMapDataset"})
_RECORD_READER_OPS = frozenset({"TFRecordDataset", "TFRecordDatasetV2"})


@dataclasses.dataclass(frozen=True)
class Passes:
    """steps: the dataset's elements (steps) in one pass over its data; None where it is not known (a
    filter, an unbatch or a generator in the way) or a pass never ends.
    shuffle_buffer: the buffer of the shuffle within a pass (0: none), and `after_map`: whether a map
    makes its elements. refill: the elements it takes in again at each pass start (0 where it keeps
    its buffer across passes), of `elements` at its level in a pass (None: unknown)."""

    steps: int | None
    shuffle_buffer: int = 0
    after_map: bool = False
    refill: int = 0
    elements: int | None = None

    @property
    def refill_share(self) -> float:
        """The refill as a share of a pass's elements (0 where either is unknown)."""
        return self.refill / self.elements if self.refill and self.elements else 0.0


def _chain(dataset) -> list:
    """The dataset and the stages under it, outermost first, as far as each keeps a single input."""
    chain = [dataset]
    while (inner := getattr(chain[-1], "_input_dataset", None)) is not None:
        chain.append(inner)
    return chain


def _name(stage) -> str:
    return type(stage).__name__


def _cardinality(stage) -> int | None:
    count = int(stage.cardinality())
    return count if count > 0 else None


def _fuses_shuffle_and_repeat(dataset) -> bool:
    """Whether TF fuses a shuffle directly under a repeat into one stage, which keeps its buffer from one
    pass into the next (its default; the option or `apply_default_optimizations=False` turn it off)."""
    optimization = dataset.options().experimental_optimization
    if optimization.shuffle_and_repeat_fusion is not None:
        return bool(optimization.shuffle_and_repeat_fusion)
    return optimization.apply_default_optimizations is not False


def passes(dataset) -> Passes:
    """The dataset's pass length and its shuffle's refill (see `Passes`)."""
    chain = _chain(dataset)
    repeat = next((i for i, stage in enumerate(chain) if _name(stage) == "_RepeatDataset"), None)
    steps = _steps_per_pass(chain, repeat)
    first = repeat + 1 if repeat is not None else 0  # a shuffle above the repeat never refills
    index = next((i for i in range(first, len(chain)) if _name(chain[i]) == "_ShuffleDataset"), None)
    if index is None:
        return Passes(steps)
    shuffle = chain[index]
    buffer = int(shuffle._buffer_size)  # noqa: SLF001  (the stage's own argument, a scalar tensor)
    elements = _elements(chain, index + 1)
    after_map = any(_name(stage) in _MAPS for stage in chain[index + 1:]) and not _holds_undecoded(shuffle)
    keeps_buffer = index == first and repeat is not None and _fuses_shuffle_and_repeat(dataset) \
        and elements is not None and buffer <= elements
    # a cache between the repeat and the shuffle serves every pass after the first: the shuffle runs once
    cached_above = any(_name(stage) in _CACHES for stage in chain[first:index])
    refill = 0 if keeps_buffer or cached_above or buffer <= 0 else min(buffer, elements or buffer)
    return Passes(steps, shuffle_buffer=max(buffer, 0), after_map=after_map, refill=refill, elements=elements)


def _holds_undecoded(stage) -> bool:
    """Whether a stage's elements are strings beside scalars at most (file names, encoded images or
    records, with their labels): a map under it read or named them and decoded nothing, so a refill of
    its shuffle costs reads, not decodes (`tf.io.read_file` in a map, as many programs write it)."""
    import tensorflow as tf

    try:
        specs = tf.nest.flatten(stage.element_spec)
    except (AttributeError, TypeError, ValueError):
        return False
    tensors = [s for s in specs if isinstance(s, tf.TensorSpec)]
    return bool(tensors) and not any(s.dtype != tf.string and s.shape.rank not in (0, None) for s in tensors) \
        and any(s.dtype == tf.string for s in tensors)


def _steps_per_pass(chain: list, repeat: int | None) -> int | None:
    """The outermost stage's elements per pass: its cardinality where TF knows it; else the elements
    under the repeat (or of the reader at the bottom), divided by the batches above them, where only
    one-for-one stages lie between."""
    if repeat is None and (known := _cardinality(chain[0])) is not None:
        return known
    limit = repeat if repeat is not None else len(chain)
    passing = _ONE_FOR_ONE if repeat is not None else _SAME_COUNT  # above a repeat, a take ends the run, not a pass
    per_step, index = 1, 0
    while index < limit and (_name(chain[index]) in _BATCHES or _name(chain[index]) in passing):
        if _name(chain[index]) in _BATCHES:
            per_step *= int(chain[index]._batch_size)  # noqa: SLF001
        index += 1
    if repeat is not None:
        elements = _elements(chain, repeat + 1) if index == repeat else None
    else:
        elements = _elements(chain, index) if index < limit else None
    return math.ceil(elements / per_step) if elements is not None and per_step > 0 else None


def _elements(chain: list, index: int) -> int | None:
    """Elements of `chain[index]` in a pass: TF's cardinality where it knows it, else the records of the
    TFRecord shards read under it through stages that keep the count (batches divide it); None where
    neither is known."""
    if index >= len(chain):
        return None
    if (known := _cardinality(chain[index])) is not None:
        return known
    per_element = 1
    for stage in chain[index:]:
        name = _name(stage)
        records = None
        if name == "TFRecordDatasetV2":
            if stage._compression_type:  # noqa: SLF001  (compressed: no headers to walk)
                return None
            records = _records_in(stage._filenames)  # noqa: SLF001  (a dataset of file names)
        elif name in _INTERLEAVES and _reads_records(stage._map_func):  # noqa: SLF001
            records = _records_in(stage._input_dataset)  # noqa: SLF001
        elif name in _BATCHES:
            per_element *= int(stage._batch_size)  # noqa: SLF001
            continue
        elif name in _SAME_COUNT:
            continue
        return math.ceil(records / per_element) if records is not None else None
    return None


def _reads_records(map_func) -> bool:
    """Whether an interleave's function opens a TFRecord reader on each element (a file name): TF's, or
    stallscope's reader of shards in a store (`stallscope.read_records`)."""
    graph = map_func.function.graph.as_graph_def()
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return any(node.op in _RECORD_READER_OPS or given_name(node) == RECORDS_STAGE for node in nodes)


def _records_in(names) -> int | None:
    """The records in the files a dataset of file names lists (`from_tensor_slices`, `list_files`)."""
    chain = _chain(names)
    source = chain[-1]
    if any(_name(stage) not in _SAME_COUNT for stage in chain[:-1]) or _name(source) != "_TensorSliceDataset":
        return None
    tensors = source._tensors  # noqa: SLF001
    if not tensors or any(t.dtype.name != "string" or len(t.shape) != 1 for t in tensors):
        return None  # names, or names beside the shard each slot reads next (`stallscope.read_records`)
    return count_records([name.decode("utf-8", "replace") for name in tensors[0].numpy()])
