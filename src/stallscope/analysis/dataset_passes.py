"""How a dataset of your own passes over its data: the steps of one pass, also through a `repeat`, and
the elements a shuffle takes in again as each pass starts, before its first output.

`stallscope.diagnose` needs both to choose its end-to-end window: a window between two pass starts is
served from a full shuffle buffer and leaves the refill's wait out. They are read from the dataset's
chain of Python dataset objects (each stage keeps its input and its arguments), which holds what the
serialized graph does not: the cardinality of the data under a `repeat`.
"""

from __future__ import annotations

import dataclasses
import math

# Stages that give one element for each element they take: a pass is as many of their outputs as inputs.
_ONE_FOR_ONE = frozenset({
    "_MapDataset", "_ParallelMapDataset", "_PrefetchDataset", "_OptionsDataset", "_ShuffleDataset", "CacheDataset",
    "_CacheDataset", "_AssertCardinalityDataset", "_TakeDataset", "_SkipDataset", "_IgnoreErrorsDataset",
    "_ModelDataset", "_OptimizeDataset", "_MapWithLegacyFunctionDataset",
})
# Stages that give one element for `_batch_size` elements they take.
_BATCHES = frozenset({"_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset"})
# Stages whose elements cost work to make (a map decodes, parses, augments): a shuffle above one holds made
# elements, so its refill redoes that work; a shuffle of file names or records refills at almost no cost.
_MAPS = frozenset({"_MapDataset", "_ParallelMapDataset", "_MapWithLegacyFunctionDataset"})


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
    within = chain[repeat + 1:] if repeat is not None else chain  # a shuffle above the repeat never refills
    index = next((i for i, stage in enumerate(within) if _name(stage) == "_ShuffleDataset"), None)
    if index is None:
        return Passes(steps)
    shuffle = within[index]
    buffer = int(shuffle._buffer_size)  # noqa: SLF001  (the stage's own argument, a scalar tensor)
    elements = _cardinality(shuffle._input_dataset)  # noqa: SLF001
    after_map = any(_name(stage) in _MAPS for stage in within[index + 1:])
    keeps_buffer = repeat is not None and index == 0 and _fuses_shuffle_and_repeat(dataset) and elements is not None and buffer <= elements
    refill = 0 if keeps_buffer or buffer <= 0 else min(buffer, elements or buffer)
    return Passes(steps, shuffle_buffer=max(buffer, 0), after_map=after_map, refill=refill, elements=elements)


def _steps_per_pass(chain: list, repeat: int | None) -> int | None:
    """The outermost stage's elements per pass: its cardinality where finite, else the elements under the
    repeat divided by the batches between it and the top, where only one-for-one stages lie between."""
    if repeat is None:
        return _cardinality(chain[0])
    per_step = 1
    for stage in chain[:repeat]:
        name = _name(stage)
        if name in _BATCHES:
            per_step *= int(stage._batch_size)  # noqa: SLF001
        elif name not in _ONE_FOR_ONE:
            return None
    elements = _cardinality(chain[repeat]._input_dataset)  # noqa: SLF001
    return math.ceil(elements / per_step) if elements is not None and per_step > 0 else None
