"""Request counters of an emulated store, shared live between the serving process and its owner.

The servers run in a child process; the numbers live in a small memory-mapped file, so the parent
reads them at any moment without asking the child (no socket, no wait), and a report can read the
JSON copy `storage serve --counters FILE` keeps up to date: `{"requests", "connections", "bytes", ...}`,
the shape `diagnose --storage-counters` reads (analysis/storage_counters.py; extra keys are ignored).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import mmap
import os
import struct
import threading
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class StoreCounters:
    """What one emulated store has done since it started.

    requests: requests answered (HTTP requests; for a mount, opens plus reads plus listings), each of
        which paid the emulated latency.
    connections: TCP connections accepted (for a mount: files opened).
    bytes: payload bytes sent to readers (object bodies, listings; for a mount, bytes read).
    lists: listing requests among `requests` (object listings; for a mount, directories read).
    errors: requests answered with an error (missing object or bucket, refused write, bad range).
    """

    requests: int = 0
    connections: int = 0
    bytes: int = 0
    lists: int = 0
    errors: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StoreCounters":
        return cls(**{field.name: int(data.get(field.name, 0)) for field in dataclasses.fields(cls)})


FIELDS = tuple(field.name for field in dataclasses.fields(StoreCounters))
# Each request's time at the store (arrival to last byte handed over), in buckets whose upper edges
# grow by 2**(1/4) (19%) from 50 us to ~30 s, plus one above: p50/p90/p99 within a bucket's width.
LATENCY_EDGES_MS = tuple(round(0.05 * 2 ** (i / 4), 6) for i in range(78))
LAYOUT_SUFFIX = ".layout.json"  # beside the counters file: its slots' names, read by storage/served_counters.py
_SLOT = struct.Struct("<q")
_COUNTER_SLOTS = len(FIELDS)
_SIZE = _SLOT.size * (_COUNTER_SLOTS + len(LATENCY_EDGES_MS) + 1)


class SharedCounters:
    """Counters in a memory-mapped file: the server adds, any process that knows the file reads."""

    def __init__(self, path: str | os.PathLike, *, create: bool) -> None:
        self.path = Path(path)
        if create:
            self.path.write_bytes(b"\0" * _SIZE)
            Path(f"{self.path}{LAYOUT_SUFFIX}").write_text(json.dumps(
                {"fields": list(FIELDS), "latency_edges_ms": list(LATENCY_EDGES_MS)}))
        with open(self.path, "r+b" if create else "rb") as handle:
            access = mmap.ACCESS_WRITE if create else mmap.ACCESS_READ
            self._map = mmap.mmap(handle.fileno(), _SIZE, access=access)
        self._lock = threading.Lock()

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                offset = FIELDS.index(name) * _SLOT.size
                _SLOT.pack_into(self._map, offset, _SLOT.unpack_from(self._map, offset)[0] + amount)

    def observe(self, seconds: float) -> None:
        """Counts one request's time at the store in its latency bucket."""
        slot = _COUNTER_SLOTS + bisect.bisect_left(LATENCY_EDGES_MS, seconds * 1000.0)
        with self._lock:
            offset = slot * _SLOT.size
            _SLOT.pack_into(self._map, offset, _SLOT.unpack_from(self._map, offset)[0] + 1)

    def latency_buckets(self) -> list[int]:
        """Requests per latency bucket so far (LATENCY_EDGES_MS, then the one above)."""
        return list(struct.unpack_from(f"<{len(LATENCY_EDGES_MS) + 1}q", self._map, _COUNTER_SLOTS * _SLOT.size))

    def snapshot(self) -> StoreCounters:
        values = struct.unpack_from(f"<{len(FIELDS)}q", self._map, 0)
        return StoreCounters(**dict(zip(FIELDS, values)))

    def write_json(self, path: str | os.PathLike, **extra) -> None:
        """Writes the counters (plus `extra` keys, e.g. the store's kind) atomically: a reader never
        sees half a file."""
        path = Path(path)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps({**extra, **self.snapshot().to_dict()}, indent=1) + "\n")
        os.replace(temporary, path)

    def close(self) -> None:
        try:
            self._map.close()
        except (BufferError, ValueError):
            pass


class InProcessCounters(SharedCounters):
    """The same interface with an anonymous map, for a server run inside the calling process."""

    def __init__(self) -> None:  # noqa: D107 - no file
        self.path = None  # type: ignore[assignment]
        self._map = mmap.mmap(-1, _SIZE)
        self._lock = threading.Lock()


def read_counters_json(path: str | os.PathLike) -> StoreCounters:
    """The counters a `stallscope storage serve --counters FILE` wrote."""
    return StoreCounters.from_dict(json.loads(Path(path).read_text()))
