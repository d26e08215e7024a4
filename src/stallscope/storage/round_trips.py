"""The store's round trip, timed on its own: a few GETs of one byte, one at a time, of objects the data
set holds, through stallscope's reader.

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

from stallscope.storage import obstore_reading, request_tally
from stallscope.storage.location import RemotePath, as_path, backend, deadline, listed_size
from stallscope.storage.request_tally import RequestTally

logger = logging.getLogger(__name__)

GETS = 24             # enough for the fastest tenth to mean something
BUDGET_S = 3.0        # at most this long, however slow the store (24 x 100 ms fits)


def time_round_trips(paths: Sequence[str], *, count: int = GETS, budget_s: float = BUDGET_S) -> RequestTally:
    """`count` one-byte GETs of the first `count` of `paths` in a store (again from the first where
    there are fewer: a few shards; empty objects left out), one at a time, for at most `budget_s`: an
    empty tally where obstore is not installed or nothing is in a store. A failed request ends the
    timing early: the pipeline's own reads already said whether the store answers."""
    remote = [p for p in (as_path(str(p)) for p in paths[:count])
              if isinstance(p, RemotePath) and listed_size(p) != 0]
    if not remote or not obstore_reading.installed():
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
