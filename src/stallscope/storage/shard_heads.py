"""First blocks of shards asked for before their shard is opened.

A shard streamed from a store (`readers`) waits a round trip and its first block's transfer when it is
opened: at each shard switch the pipeline's buffers must cover that wait, or a step stalls (tuned
records at 10 ms, 4 shards of 24 MB read one at a time: 30 ms at every switch and 85 ms at every
epoch start, steps of 13.5 ms otherwise). The reader of a shard knows which shard its slot opens next
(`readers.with_following`), so once its own last block is in it asks for that one's first block here,
and the next open takes the request instead of making one.

A request is taken only for the object it was asked for: the same name, through the same client, as
the same listing entry (size and time), so a shard written again or a store's client made anew since
(another endpoint, another timeout) asks afresh. The oldest is given up beyond HEADS_KEPT, so guesses
that never come true (a mispredicted interleave slot, a run stopped early) hold at most HEADS_KEPT
first blocks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading

from stallscope.storage.location import ObjectInfo, RemotePath, listed_info

# First blocks asked for ahead and not yet taken, at most (each FIRST_BLOCK_BYTES: 32 MB in all).
HEADS_KEPT = 8


@dataclasses.dataclass(frozen=True)
class _Head:
    name: str
    store: object
    listed: ObjectInfo
    request: concurrent.futures.Future


_lock = threading.Lock()
_pending: list[_Head] = []  # oldest first


def ask(path: RemotePath, store, first_span) -> bool:
    """Asks `store` now for `path`'s first block (`first_span(size)` -> (start, end) or None) where
    the listing this process holds gives its size (no round trip for a size here); False where it does
    not, the shard is empty, or the request cannot be made (its shard's own open then says why)."""
    listed = listed_info(path)
    span = first_span(listed.size) if listed is not None and listed.size else None
    if span is None:
        return False
    try:
        request = store.request_range(path, *span)
    except Exception:  # noqa: BLE001  (a guess ahead must not fail the shard being read)
        return False
    with _lock:
        _pending.append(_Head(str(path), store, listed, request))
        while len(_pending) > HEADS_KEPT:
            _pending.pop(0).request.cancel()
    return True


def take(path: RemotePath, store) -> concurrent.futures.Future | None:
    """The oldest request asked ahead for this very object's first block through `store`, no longer
    kept here; None if none."""
    name, listed = str(path), listed_info(path)
    with _lock:
        for index, head in enumerate(_pending):
            if head.name == name and head.store is store and head.listed == listed:
                return _pending.pop(index).request
    return None


def forget() -> None:
    """Gives up every request asked ahead (tests; a process that stops reading)."""
    with _lock:
        for head in _pending:
            head.request.cancel()
        _pending.clear()
