"""What an emulated store (`stallscope storage serve`) has served, read by whoever reads from it.

The emulator keeps its counters in a memory-mapped file of little-endian 64-bit integers, beside a
layout file (`FILE.layout.json`: the counters' names in order, then the upper edges in ms of its
request-latency histogram, whose bucket counts follow the counters). A reader finds the file by where
its data is: `STALLSCOPE_STORE_COUNTERS` in the environment for gs:// and s3:// (the emulator's export
lines and `emulate().env` carry it), or the mount's source name, `stallscope-storage:FILE`, for a path
on the emulator's FUSE mount. Reading costs a few microseconds and never asks the store anything, so a
training step can read it before and after.

The histogram is of each request's time at the store, from its arrival (its headers in, or the kernel's
call into the mount) to its last byte handed to the socket (or its data returned to the kernel),
whichever client made it: TF's gs://, s3fs, obstore or the kernel reading for any program on the mount.
"""

from __future__ import annotations

import bisect
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any

from stallscope.mountinfo import unescape

COUNTERS_ENV = "STALLSCOPE_STORE_COUNTERS"
MOUNT_SOURCE_PREFIX = "stallscope-storage:"
LAYOUT_SUFFIX = ".layout.json"
MOUNTINFO = Path("/proc/self/mountinfo")


class ServedCounters:
    """A live, read-only view of one emulated store's counters."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        layout = json.loads(Path(f"{self.path}{LAYOUT_SUFFIX}").read_text())
        self.fields: tuple[str, ...] = tuple(layout["fields"])
        self.edges_ms: tuple[float, ...] = tuple(float(edge) for edge in layout.get("latency_edges_ms", ()))
        self._slots = len(self.fields) + len(self.edges_ms) + (1 if self.edges_ms else 0)  # + the bucket above
        with open(self.path, "rb") as handle:
            self._map = mmap.mmap(handle.fileno(), 8 * self._slots, access=mmap.ACCESS_READ)

    def read(self) -> dict[str, Any]:
        """{counter: value, ..., "latency_buckets": [count per bucket]} as of now."""
        values = struct.unpack_from(f"<{self._slots}q", self._map, 0)
        counters: dict[str, Any] = dict(zip(self.fields, values))
        counters["latency_buckets"] = list(values[len(self.fields):])
        return counters

    def counts(self) -> tuple[int, int]:
        """(requests, bytes) served so far."""
        values = struct.unpack_from(f"<{len(self.fields)}q", self._map, 0)
        named = dict(zip(self.fields, values))
        return named.get("requests", 0), named.get("bytes", 0)

    def latency(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
        """The requests' time at the store between two readings: p50, p90, p99 (ms) and the histogram."""
        buckets = [b - a for a, b in zip(before["latency_buckets"], after["latency_buckets"])]
        return latency_summary(self.edges_ms, buckets)


def latency_summary(edges_ms: tuple[float, ...], buckets: list[int]) -> dict[str, Any] | None:
    """p50/p90/p99 in ms (interpolated within a bucket, geometrically: the edges grow by a ratio) and the
    non-empty buckets as [{"up_to_ms": edge or None (above the last), "requests": n}]; None without any."""
    total = sum(buckets)
    if total <= 0 or not edges_ms:
        return None

    def percentile(share: float) -> float:
        wanted = share * total
        seen = 0
        for index, count in enumerate(buckets):
            if count and seen + count >= wanted:
                upper = edges_ms[index] if index < len(edges_ms) else edges_ms[-1]
                lower = edges_ms[index - 1] if index > 0 else upper / (edges_ms[1] / edges_ms[0])
                if index >= len(edges_ms):
                    return upper  # above the last edge: the edge is all that is known
                part = (wanted - seen) / count
                return lower * (upper / lower) ** part
            seen += count
        return edges_ms[-1]

    histogram = [{"up_to_ms": edges_ms[i] if i < len(edges_ms) else None, "requests": count}
                 for i, count in enumerate(buckets) if count]
    return {"requests": total, "p50_ms": percentile(0.50), "p90_ms": percentile(0.90),
            "p99_ms": percentile(0.99), "histogram": histogram}


def bucket_of(edges_ms: tuple[float, ...], ms: float) -> int:
    """The bucket a time falls in: the first whose upper edge is at or above it (len(edges): above all)."""
    return bisect.bisect_left(edges_ms, ms)


def _mount_source(path: str) -> str | None:
    """The source field of the mount `path` is on (for a FUSE mount, its fsname)."""
    try:
        text = MOUNTINFO.read_text()
    except OSError:
        return None
    where = os.path.realpath(path)
    best = None
    for line in text.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        point = unescape(fields[4])
        if where == point or where.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= len(best[0]):
                best = (point, unescape(tail[1]))
    return best[1] if best else None


def counters_file_for(location: str | os.PathLike) -> Path | None:
    """The counters file of the emulated store `location` is on; None where it is not on one (or the
    file is gone)."""
    text = os.fspath(location)
    if text.startswith(("gs://", "s3://")):
        found = os.environ.get(COUNTERS_ENV)
    else:
        source = _mount_source(text)
        found = source[len(MOUNT_SOURCE_PREFIX):] if source and source.startswith(MOUNT_SOURCE_PREFIX) else None
    if not found or not Path(found).is_file() or not Path(f"{found}{LAYOUT_SUFFIX}").is_file():
        return None
    return Path(found)


def served_counters_for(location: str | os.PathLike) -> ServedCounters | None:
    """A live view of the counters of the emulated store `location` is on, or None."""
    path = counters_file_for(location)
    if path is None:
        return None
    try:
        return ServedCounters(path)
    except (OSError, ValueError, KeyError, struct.error):
        return None
