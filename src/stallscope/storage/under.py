"""What storage a data set's path is on: local disk, a network file system (by its mount's type), or
a bucket (gs://, s3://); and, for a file system, what one open and read of a file costs there.

A diagnosis and `tuned` decide how many reads to keep in flight from this: a network file system
answers each open and each read with a round trip (NFS: LOOKUP/GETATTR, then READ; a FUSE mount: a
request to its daemon each), so tf.data's shared pool, one thread per core, keeps about as many reads
waiting as there are cores and the decode starves, as on a bucket.

The open-and-read timing is taken one file at a time with nothing else in flight, so it is the
storage's own round trip and not the pipeline's queueing (the same reason the bucket's is taken from
one-byte GETs, `round_trips.py`); the page cache is told to drop each file first, so a cached page
does not answer the read.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from stallscope.storage.location import is_remote
from stallscope.storage.mounts import NetworkGuard, network_file_system

logger = logging.getLogger(__name__)

OPENS = 24            # files opened and read one at a time (as many one-byte GETs time a bucket)
BUDGET_S = 3.0        # at most this long, however slow the file system
FASTEST_SHARE = 0.1   # the figure is the fastest tenth: a round trip, not a queue behind other work


@dataclasses.dataclass(frozen=True)
class StorageUnder:
    """The storage a path is on. kind: "local", "network-fs", "gs" or "s3"; fstype: the kernel's type
    of a file system ("nfs4", "fuse", "fuse.gcsfuse"), None for a bucket."""

    kind: str
    fstype: str | None = None

    @property
    def fuse(self) -> bool:
        """A FUSE mount: its requests are answered by a daemon on this host (`fuse_daemons`)."""
        return self.kind == "network-fs" and (self.fstype or "").startswith("fuse")

    @property
    def remote(self) -> bool:
        """Its bytes live on another machine: every read pays a round trip."""
        return self.kind != "local"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "type": self.fstype, "label": self.label}

    @property
    def label(self) -> str:
        """"local disk", "nfs4 mount", "gcsfuse (FUSE) mount", "fuse mount", "gs:// bucket"."""
        if self.kind == "network-fs":
            fstype = self.fstype or "network"
            return f"{fstype[len('fuse.'):]} (FUSE) mount" if fstype.startswith("fuse.") else f"{fstype} mount"
        return {"local": "local disk", "gs": "gs:// bucket", "s3": "s3:// bucket"}[self.kind]


def storage_under(path: Any) -> StorageUnder:
    """The storage under `path` (a local path, or gs://... / s3://...)."""
    text = os.fspath(path) if not isinstance(path, str) else path
    if is_remote(text):
        return StorageUnder(text.split("://", 1)[0])
    fstype = network_file_system(text)
    return StorageUnder("network-fs", fstype) if fstype else StorageUnder("local", None)


@dataclasses.dataclass(frozen=True)
class FileRoundTrips:
    """Opens and one-byte reads of files, one at a time: each call's seconds."""

    opens: tuple[float, ...] = ()
    reads: tuple[float, ...] = ()

    @property
    def count(self) -> int:
        return min(len(self.opens), len(self.reads))

    def _fastest_ms(self, times: Sequence[float]) -> float | None:
        if not times:
            return None
        if len(times) == 1:
            return times[0] * 1000.0
        return statistics.quantiles(sorted(times), n=100, method="inclusive")[round(FASTEST_SHARE * 100) - 1] * 1000.0

    @property
    def open_ms(self) -> float | None:
        """The fastest tenth of the opens (ms)."""
        return self._fastest_ms(self.opens)

    @property
    def read_ms(self) -> float | None:
        return self._fastest_ms(self.reads)

    @property
    def open_and_read_ms(self) -> float | None:
        """One file's open plus its first read: what each JPEG of a tree costs before its bytes."""
        return self._fastest_ms([o + r for o, r in zip(self.opens, self.reads)])

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.count, "open_ms": self.open_ms, "read_ms": self.read_ms,
                "open_and_read_ms": self.open_and_read_ms}


def _open_and_read(path: str) -> tuple[float, float]:
    started = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    opened = time.perf_counter()
    try:
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the read goes to the storage, not the cache
        except OSError:
            pass
        before = time.perf_counter()
        os.pread(fd, 1, 0)
        read = time.perf_counter() - before
    finally:
        os.close(fd)
    return opened - started, read


def time_file_round_trips(paths: Sequence[str], *, count: int = OPENS, budget_s: float = BUDGET_S,
                          flag: str = "--dataset_path") -> FileRoundTrips:
    """Opens and one-byte reads of up to `count` of `paths` (spread over the list, non-empty files),
    one at a time, for at most `budget_s`; bounded by the storage timeout on a network file system (a
    server that stops answering is one line naming `flag`). Empty where nothing could be read."""
    local = [os.fspath(p) for p in paths if not is_remote(os.fspath(p))]
    if not local:
        return FileRoundTrips()
    step = max(1, len(local) // count)
    chosen = local[::step][:count]
    guard = NetworkGuard.of(chosen[0], flag)

    def timing() -> FileRoundTrips:
        opens, reads = [], []
        ends = time.monotonic() + budget_s
        for path in itertools.islice(itertools.cycle(chosen), count):
            if time.monotonic() > ends:
                break
            try:
                if os.path.getsize(path) == 0:
                    continue
                opened, read = _open_and_read(path)
            except OSError as exc:
                logger.info("file round trips: stopped at %s (%s)", path, exc)
                break
            opens.append(opened)
            reads.append(read)
        return FileRoundTrips(tuple(opens), tuple(reads))

    return guard(timing, f"answered no open or read of {len(chosen)} files")
