"""What stallscope's own object reader asked of a store in this process: requests, bytes, and each
request's time from asking to its last byte, as the reader saw it.

A real bucket keeps no counters a diagnosis can read (only the emulator writes them), so without this
the requests and waits of a run against GCS or S3 were modelled, never measured. The reader counts
them itself, as it makes them: `diagnose` reads a snapshot before and after its pipeline probe and
reports the difference per image, with the requests' median and 90th-percentile times. Counting
costs a clock read and a lock per request (~1 us, against ~0.3 ms of the request itself).

Only requests this reader makes are counted (obstore's GETs, ranged GETs and HEADs); TF's own gs://
client and s3fs keep theirs to themselves, and their figures stay modelled.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

# Requests whose time and size are kept for the percentiles: the last this many (a probe makes a few
# hundred to a few thousand).
KEPT_TIMES = 8192

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RequestTally:
    """Requests made, bytes received, and (seconds, bytes) of the last requests, oldest first."""

    requests: int = 0
    bytes: int = 0
    seconds: float = 0.0
    samples: tuple[tuple[float, int], ...] = ()

    def since(self, earlier: "RequestTally") -> "RequestTally":
        """The requests made after `earlier` was taken (the samples of at most the last KEPT_TIMES)."""
        made = self.requests - earlier.requests
        if made < 0:
            raise ValueError("request tallies out of order: the later one counts fewer requests")
        kept = min(made, len(self.samples))
        return RequestTally(made, self.bytes - earlier.bytes, self.seconds - earlier.seconds,
                            self.samples[len(self.samples) - kept:] if kept else ())

    def requests_per_image(self, image_bytes: float) -> float | None:
        """Requests per image of `image_bytes`, taken per byte received: blocks a reader had asked for
        ahead when the counting stopped do not count against the images taken meanwhile. None
        without bytes (only requests with no body)."""
        return self.requests * image_bytes / self.bytes if self.bytes > 0 and image_bytes > 0 else None

    def percentile_ms(self, share: float, *, most_bytes: int | None = None) -> float | None:
        """The request time (ms) below which `share` of the kept requests fall (of those that received
        at most `most_bytes`, where given); None without such requests."""
        times = sorted(t for t, size in self.samples if most_bytes is None or size <= most_bytes)
        if not times:
            return None
        if len(times) == 1:
            return times[0] * 1000.0
        cuts = statistics.quantiles(times, n=100, method="inclusive")
        return cuts[min(99, max(1, round(share * 100))) - 1] * 1000.0

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "bytes": self.bytes, "seconds": self.seconds,
                "median_ms": self.percentile_ms(0.5), "p90_ms": self.percentile_ms(0.9)}


class _Counter:
    """The process's running tally (made afresh in a forked child, whose requests are its own)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.seconds = 0.0
        self.samples: collections.deque[tuple[float, int]] = collections.deque(maxlen=KEPT_TIMES)

    def add(self, received: int, seconds: float) -> None:
        with self.lock:
            self.requests += 1
            self.bytes += received
            self.seconds += seconds
            self.samples.append((seconds, received))

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.requests, self.bytes

    def snapshot(self) -> RequestTally:
        with self.lock:
            return RequestTally(self.requests, self.bytes, self.seconds, tuple(self.samples))


_counter = _Counter()


def _fresh_in_child() -> None:
    global _counter
    _counter = _Counter()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_in_child)


def snapshot() -> RequestTally:
    """This process's requests so far."""
    return _counter.snapshot()


def counts() -> tuple[int, int]:
    """This process's (requests, bytes) so far, without copying the kept times: cheap enough per step."""
    return _counter.counts()


def timed(request: Callable[[], T], size: Callable[[T], int] = len) -> T:
    """Makes one request and counts it with the bytes `size` says it received (a failed one is not
    counted: its time says nothing of the store's pace)."""
    started = time.perf_counter()
    answer = request()
    _counter.add(size(answer), time.perf_counter() - started)
    return answer
