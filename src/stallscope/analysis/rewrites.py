"""Where TF's automatic rewrites changed the pipeline the user wrote (pipeline.json: written vs ran).

TF 2.21 rewrites a pipeline when the iterator is made: a sequential map becomes a ParallelMap
(`map_parallelization`), a prefetch is added at the end (`inject_prefetch`), map + batch are fused
(`map_and_batch_fusion`), ... The user's code and the profile then disagree; this names each change.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence

# (written stages, ran stages) -> the TF option that does it
_KNOWN = (
    (("Map",), ("ParallelMap",), "map_parallelization"),
    ((), ("Prefetch",), "inject_prefetch"),
    (("Map", "Batch"), ("MapAndBatch",), "map_and_batch_fusion"),
    (("Batch", "Map"), ("MapAndBatch",), "map_and_batch_fusion"),
    (("Batch",), ("ParallelBatch",), "parallel_batch"),
    (("Map", "Map"), ("Map",), "map_fusion"),
    (("Shuffle", "Repeat"), ("ShuffleAndRepeat",), "shuffle_and_repeat_fusion"),
    (("Repeat", "Shuffle"), ("ShuffleAndRepeat",), "shuffle_and_repeat_fusion"),
)


@dataclasses.dataclass(frozen=True)
class Rewrite:
    written: tuple[str, ...]
    ran: tuple[str, ...]
    option: str          # the tf.data option responsible, or "" when not a known rewrite

    def describe(self) -> str:
        before = " + ".join(self.written) or "(nothing)"
        after = " + ".join(self.ran) or "(removed)"
        why = f" ({self.option})" if self.option else ""
        return f"{before} became {after}{why}"


def normalise(stage: str) -> str:
    """Profile and graph spellings to one vocabulary: ParallelMapV2 / ParallelMapDatasetV2 -> ParallelMap."""
    name = re.sub(r"^Experimental", "", stage)
    name = re.sub(r"\[\d+\]$", "", name)
    return re.sub(r"(Dataset)?(V\d+)?$", "", name)


def rewrites(written: Sequence[str], ran: Sequence[str]) -> tuple[Rewrite, ...]:
    """The differences between the chains (outermost first), each named by the option behind it."""
    before = [normalise(s) for s in written]
    after = [normalise(s) for s in ran]
    changes = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        old, new = tuple(before[i1:i2]), tuple(after[j1:j2])
        changes.append(Rewrite(written=old, ran=new, option=_option_for(old, new)))
    return tuple(changes)


def _option_for(old: tuple[str, ...], new: tuple[str, ...]) -> str:
    for written, ran, option in _KNOWN:
        if old == written and new == ran:
            return option
    return ""


def config_rewrites(config, ran: Sequence[str]) -> tuple[Rewrite, ...]:
    """Rewrites visible from the requested config alone, when the run recorded no written chain:
    a sequential map (map_parallelism none) that ran as ParallelMap or MapAndBatch, or no prefetch
    asked for while the run's outermost stage is a Prefetch."""
    stages = [normalise(s) for s in ran]
    changes = []
    if config.map_parallelism is None and "ParallelMap" in stages:
        changes.append(Rewrite(("Map",), ("ParallelMap",), "map_parallelization"))
    if "MapAndBatch" in stages:
        changes.append(Rewrite(("Map", "Batch"), ("MapAndBatch",), "map_and_batch_fusion"))
    if config.prefetch is None and stages[:1] == ["Prefetch"]:
        changes.append(Rewrite((), ("Prefetch",), "inject_prefetch"))
    return tuple(changes)
