"""The store's round trip and bandwidth, timed on their own through stallscope's reader: a few GETs of
one byte, one at a time, of objects the data set holds; and, where its objects are large (shards),
ranged GETs of 4 MiB blocks, several in flight, for a second or two.

`diagnose` takes a store's latency from these rather than from the pipeline's own requests, which
share the cores with its decoding and with each other (64 in flight: even the fastest tenth of them
took 1.3-2.1x the emulated latency at 3-10 ms), and which TF's own `gs://` client does not let
stallscope count at all. One byte: the request's own round trip, as a GET pays it (a store may answer
a HEAD by another path), with nothing to transfer. Taken after the probes, with nothing else in flight.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence

from stallscope.storage import obstore_client, request_tally
from stallscope.storage.location import RemotePath, as_path, backend, deadline, listed_size
from stallscope.storage.request_tally import RequestTally

logger = logging.getLogger(__name__)

GETS = 24             # enough for the fastest tenth to mean something
BUDGET_S = 3.0        # at most this long, however slow the store (24 x 100 ms fits)
TIMING_STEP = "probe: the store's round trip and bandwidth (one-byte GETs one at a time; 4 MiB blocks of shards)"


def _in_store(paths: Sequence[str]) -> list[RemotePath]:
    return [p for p in (as_path(str(p)) for p in paths) if isinstance(p, RemotePath)]


def time_round_trips(paths: Sequence[str], *, count: int = GETS, budget_s: float = BUDGET_S) -> RequestTally:
    """`count` one-byte GETs of the first `count` of `paths` in a store (again from the first where
    there are fewer: a few shards; empty objects left out), one at a time, for at most `budget_s`: an
    empty tally where obstore is not installed or nothing is in a store. A failed request ends the
    timing early: the pipeline's own reads already said whether the store answers."""
    remote = [p for p in _in_store(paths[:count]) if listed_size(p) != 0]
    if not remote or not obstore_client.installed():
        return RequestTally()
    before = request_tally.snapshot()
    ends = time.monotonic() + budget_s
    for path in itertools.islice(itertools.cycle(remote), count):
        if time.monotonic() > ends:
            break
        try:
            backend(path).request_range(path, 0, 1).result(timeout=deadline())
        except Exception as exc:  # obstore's errors, a store silent past the deadline (TimeoutError)
            logger.info("round trips: stopped at %s (%s)", path, exc)
            break
    return request_tally.snapshot().since(before)


BLOCK_BYTES = 4 << 20          # a ranged GET large enough that its time is mostly transfer
BLOCKS_IN_FLIGHT = 8
TRANSFER_BYTES = 64 << 20      # at most this much read (a real store bills it as egress)
TRANSFER_BUDGET_S = 2.0


def time_transfer(paths: Sequence[str], *, latency_ms: float = 0.0, max_bytes: int = TRANSFER_BYTES,
                  budget_s: float = TRANSFER_BUDGET_S) -> float | None:
    """Bytes/s the store gives ranged GETs of BLOCK_BYTES from the largest of `paths` (at least that
    large), BLOCKS_IN_FLIGHT at once, in waves, for at most `max_bytes` and `budget_s`; each wave's
    round trip (`latency_ms`) is taken out of the time. None where no object is that large, obstore is
    not installed, or a request fails."""
    sized = sorted(((listed_size(p) or 0, p) for p in _in_store(paths)), key=lambda item: -item[0])
    per_object = [[(path, start) for start in range(0, size - BLOCK_BYTES + 1, BLOCK_BYTES)]
                  for size, path in sized if size >= BLOCK_BYTES]
    if not per_object or not obstore_client.installed():
        return None
    # Blocks taken from every object in turn, so a wave reads from several objects at once, as shards are read.
    ordered = [block for turn in itertools.zip_longest(*per_object) for block in turn if block]
    got, waves, started = 0, 0, time.monotonic()
    for first in range(0, min(len(ordered), max_bytes // BLOCK_BYTES), BLOCKS_IN_FLIGHT):
        wave = ordered[first:first + BLOCKS_IN_FLIGHT]
        try:
            pending = [backend(path).request_range(path, start, start + BLOCK_BYTES) for path, start in wave]
            got += sum(len(p.result(timeout=deadline())) for p in pending)
        except Exception as exc:  # obstore's errors, a store silent past the deadline
            logger.info("transfer: stopped (%s)", exc)
            return None
        waves += 1
        if time.monotonic() - started >= budget_s:
            break
    moving = time.monotonic() - started - waves * latency_ms / 1000.0
    return got / moving if got and moving > 0 else None


def time_store(paths: Sequence[str]) -> tuple[RequestTally, float | None]:
    """(round trips, bytes/s): the store's latency from `time_round_trips`, and its bandwidth from
    `time_transfer` where the objects average BLOCK_BYTES or more (shards; None for a JPEG tree, whose
    objects are too small for a GET's time to be its transfer)."""
    trips = time_round_trips(paths)
    sizes = [listed_size(p) or 0 for p in _in_store(paths)]
    if not sizes or sum(sizes) / len(sizes) < BLOCK_BYTES:
        return trips, None
    return trips, time_transfer(paths, latency_ms=trips.percentile_ms(0.1) or 0.0)
