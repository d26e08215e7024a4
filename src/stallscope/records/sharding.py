"""Shard arithmetic as pure functions: seeded shuffles, cuts by count or by size, file names.

Nothing here touches files or TensorFlow, so the plan of a conversion is a function of its inputs:
the same tree and options always give the same shards, which is what makes a killed conversion
resumable (see `convert.py`).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import TypeVar

from stallscope.config import require_positive

T = TypeVar("T")

SHARD_SUFFIX = ".tfrecord"
SHARD_NAME = re.compile(r"^(?P<split>[A-Za-z0-9_.]+)-(?P<index>\d{5})-of-(?P<total>\d{5})\.tfrecord$")


def shard_filename(split: str, index: int, total: int) -> str:
    """`train-00000-of-00016.tfrecord` (seed-003's naming)."""
    if not 0 <= index < total:
        raise ValueError(f"shard index {index} outside [0, {total})")
    return f"{split}-{index:05d}-of-{total:05d}{SHARD_SUFFIX}"


def split_seed(seed: int, split: str) -> int:
    """A per-split seed that does not depend on Python's hash randomisation."""
    digest = hashlib.sha256(f"{seed}:{split}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def shuffled(items: Sequence[T], seed: int, split: str) -> list[T]:
    """A copy of `items` in a seeded order, so no shard holds a single class."""
    out = list(items)
    random.Random(split_seed(seed, split)).shuffle(out)
    return out


def ranges_by_count(n_items: int, n_shards: int) -> list[range]:
    """`n_shards` contiguous ranges whose sizes differ by at most one (larger ones first)."""
    require_positive("shards", n_shards)
    if n_items < 0:
        raise ValueError(f"n_items must be >= 0, got {n_items}")
    return [range(i * n_items // n_shards, (i + 1) * n_items // n_shards) for i in range(n_shards)]


def ranges_by_size(sizes: Sequence[int], target_bytes: int) -> list[range]:
    """seed-000's rule: add items to a shard until its bytes reach `target_bytes`, then start a new one.

    A shard therefore holds at least `target_bytes` (except the last) and exceeds it by less than one
    item. An empty input gives one empty range, so every split still has a shard.
    """
    require_positive("size_per_record", target_bytes)
    ranges: list[range] = []
    start = 0
    total = 0
    for i, size in enumerate(sizes):
        total += size
        if total >= target_bytes:
            ranges.append(range(start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes) or not ranges:
        ranges.append(range(start, len(sizes)))
    return ranges


def chunk_ranges(span: range, chunk: int) -> list[range]:
    """Cuts a range into pieces of at most `chunk` items (the unit of work sent to a worker)."""
    require_positive("chunk", chunk)
    return [range(i, min(i + chunk, span.stop)) for i in range(span.start, span.stop, chunk)]
