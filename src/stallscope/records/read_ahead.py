"""A conversion worker's file reads, ahead of its checks where reads wait.

A local page cache answers a 78 KB read in tens of microseconds, a network file system (NFS, SMB, a
FUSE mount of a bucket) in a round trip or more per open and per read: milliseconds. A worker that
reads one file, checks it, then reads the next waits for each of those round trips in turn: from a
FUSE mount paying 5 ms a request, 1,500 JPEGs took 7.1 s to convert against 1.0 s from local disk
(3 workers, 2 cores; `benchmarks/convert_mount.py`). So a worker keeps the next files' reads in
flight on threads while it checks the current one (a read releases the GIL), and takes them in
order, so the shards' bytes do not change.

`depth=None` (auto) reads in turn and times the reads against the work between them; once reads are
slow (SLOW_READ_S) and no small share of the work, it reads ahead, then adjusts the depth from what
the reads in flight take (`next_depth`), for the rest of the process. Where reads are quick nothing
changes: no thread, no hand-off.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import math
import os
import queue
import statistics
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from stallscope.storage.location import StorageError, storage_timeout
from stallscope.storage.mounts import network_file_system

log = logging.getLogger(__name__)

AUTO = None
PROBE_READS = 16  # reads timed before auto decides, and again before each change of depth
SLOW_READ_S = 0.5e-3  # a read slower than this waits for a device or a network, not for the page cache
SLOW_SHARE = 0.1  # and reads must take at least this share of the work between them
# Auto starts at most this many files ahead, and doubles the depth while the checks still wait and a
# read in flight takes no longer than one read in turn did, up to MAX_DEPTH; a read taking twice as
# long says the store queues them (a server answers only so many at once: nfsd starts 8 threads,
# libfuse 10), and the depth halves. `--read-ahead N` sets any fixed depth.
FIRST_MAX_DEPTH = 8
MAX_DEPTH = 32  # 17 workers keep up to ~550 reads in flight
QUEUED = 2.0  # a read in flight this many times slower than in turn is queued at the store
UNQUEUED = 1.2  # one at most this many times slower is not


def choose_depth(read_s: float, work_s: float) -> int:
    """Files to keep in flight for a read time `read_s` and work between reads `work_s` (typical
    values: medians): 0 where reads are quick, else enough that a read's wait is covered by the work on
    the files before it, plus one, up to FIRST_MAX_DEPTH."""
    if read_s < SLOW_READ_S or read_s < SLOW_SHARE * work_s:
        return 0
    return min(FIRST_MAX_DEPTH, math.ceil(read_s / max(work_s, 1e-6)) + 1)


def next_depth(depth: int, read_in_turn_s: float, work_s: float, read_ahead_s: float, waited_s: float) -> int:
    """The depth after a window of reads ahead: halved where a read in flight (`read_ahead_s`, typical)
    takes QUEUED times a read in turn, doubled where the checks still waited (`waited_s`, mean per file)
    a share of their work and reads in flight take no longer than UNQUEUED times one in turn."""
    if read_ahead_s > QUEUED * read_in_turn_s:
        return max(2, depth // 2)
    if waited_s > SLOW_SHARE * work_s and read_ahead_s <= UNQUEUED * read_in_turn_s:
        return min(MAX_DEPTH, depth * 2)
    return depth


def read_file(path: str | bytes) -> bytes | OSError:
    """A file's bytes in one read into the bytes object, or the OSError that stopped the read (the
    checks report it as the file's reason)."""
    try:
        with open(path, "rb", buffering=0) as handle:
            return handle.readall()
    except OSError as exc:
        return exc


@dataclasses.dataclass
class ReadStats:
    """What a reader saw, summed: reads timed in turn and their time, the work between them, the time
    the checks waited for reads ahead, and the most files read ahead at once (0: all in turn)."""

    timed_reads: int = 0
    read_s: float = 0.0
    work_s: float = 0.0
    waited_s: float = 0.0
    depth: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def add(self, other: dict[str, Any]) -> None:
        for name in ("timed_reads", "read_s", "work_s", "waited_s"):
            setattr(self, name, getattr(self, name) + other[name])
        self.depth = max(self.depth, other["depth"])

    @property
    def mean_read_s(self) -> float:
        return self.read_s / self.timed_reads if self.timed_reads else 0.0


class FileReader:
    """Reads the files of work items `(path, name, label, label_text)` and yields the items with the
    bytes (or the OSError) in the path's place, in order. One per process: what auto learns about the
    storage holds for the tasks that follow. On a network file system every read runs on a thread and
    is waited for at most the storage timeout: a server that stops answering is one line naming the
    file, not a conversion that hangs."""

    def __init__(self, depth: int | None = AUTO) -> None:
        self.setting = depth
        self.depth = depth or 0
        self.stats = ReadStats()
        self.network: str | None = None  # the network file system's type, once the first path is seen
        self._seen_path = False
        self._reads: list[float] = []  # auto's window of read times, kept across tasks
        self._works: list[float] = []  # ... of the work after each read (in turn) or waits for it (ahead)
        self._read_in_turn_s = 0.0  # typical, when auto chose to read ahead
        self._work_s = 0.0

    def contents(self, items: Iterable[tuple]) -> Iterator[tuple]:
        items = iter(items)
        first = next(items, None)
        if first is None:
            return
        if not self._seen_path:
            self._seen_path = True
            self.network = network_file_system(os.path.dirname(os.fsdecode(first[0])))
        items = itertools.chain((first,), items)
        if not self.depth:
            yield from self._in_turn(items)
        if self.depth:  # set from the start, or by auto while reading in turn
            yield from self._ahead(items)

    def task_stats(self) -> dict[str, Any]:
        """The stats since the last call, for a task's result (the parent sums them)."""
        stats, self.stats = self.stats, ReadStats(depth=self.depth)
        stats.depth = max(stats.depth, self.depth)
        return stats.to_dict()

    def _in_turn(self, items: Iterator[tuple]) -> Iterator[tuple]:
        """Reads one file at a time (on a network file system, on one thread, its wait bounded); under
        auto, times each read and the work after it, and moves to reading ahead (returning the rest of
        `items` to `contents`) once a window's medians say reads wait. Medians: a worker's first image
        also pays its imports."""
        timing = self.setting is AUTO
        reads, works = self._reads, self._works
        clock = time.perf_counter
        threads = _ReadThreads() if self.network else None
        try:
            for item in items:
                started = clock()
                data = self._result(threads.submit(item[0], 1), item[0])[0] if threads else read_file(item[0])
                read = clock()
                yield (data, *item[1:])
                if not timing:
                    continue
                reads.append(read - started)
                works.append(clock() - read)
                if len(reads) == PROBE_READS:
                    self.stats.timed_reads += len(reads)
                    self.stats.read_s += sum(reads)
                    self.stats.work_s += sum(works)
                    self._read_in_turn_s, self._work_s = statistics.median(reads), statistics.median(works)
                    self.depth = choose_depth(self._read_in_turn_s, self._work_s)
                    self.stats.depth = max(self.stats.depth, self.depth)
                    reads.clear()
                    works.clear()
                    if self.depth:
                        return
        finally:
            if threads:
                threads.close()

    def _ahead(self, items: Iterator[tuple]) -> Iterator[tuple]:
        """Keeps `depth` reads in flight on threads; yields in order. Under auto, each window of reads
        may change the depth (`next_depth`)."""
        threads = _ReadThreads()
        window: collections.deque = collections.deque()
        try:
            for item in items:
                window.append((threads.submit(item[0], self.depth), item))
                while len(window) >= self.depth:  # more than one after the depth halved
                    yield self._next(window)
            while window:
                yield self._next(window)
        finally:
            threads.close()  # left early (an error in the checks): the reads in flight are not waited for

    def _result(self, future: concurrent.futures.Future, path: str | bytes) -> tuple[bytes | OSError, float]:
        """A read's (bytes or error, seconds), waited for at most the storage timeout."""
        timeout_s = storage_timeout()
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            where = f" ({self.network})" if self.network else ""
            raise StorageError(f"{os.fsdecode(path)}: the file system{where} did not answer a read in {timeout_s:g} s; "
                               "expected it within --storage-timeout") from None

    def _next(self, window: collections.deque) -> tuple:
        future, item = window.popleft()
        started = time.perf_counter()
        data, read_s = self._result(future, item[0])
        waited = time.perf_counter() - started
        self.stats.waited_s += waited
        if self.setting is AUTO:
            self._reads.append(read_s)
            self._works.append(waited)
            if len(self._reads) == PROBE_READS:
                read_ahead_s, waited_s = statistics.median(self._reads), statistics.fmean(self._works)
                depth = next_depth(self.depth, self._read_in_turn_s, self._work_s, read_ahead_s, waited_s)
                log.debug("reads %d ahead: %.1f ms each (%.1f in turn), checks waited %.1f ms a file (work %.1f): %d ahead",
                          self.depth, read_ahead_s * 1e3, self._read_in_turn_s * 1e3, waited_s * 1e3,
                          self._work_s * 1e3, depth)
                self.depth = depth
                self.stats.depth = max(self.stats.depth, self.depth)
                self._reads.clear()
                self._works.clear()
        return (data, *item[1:])


class _ReadThreads:
    """Daemon threads that read and time files, started as the depth asks for them. A read stuck in a
    file system that no longer answers holds one of them and never the process (concurrent.futures'
    threads are joined at exit); the reader waits on each read at most the storage timeout."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = 0
        self._closed = False

    def submit(self, path: str | bytes, threads: int) -> concurrent.futures.Future:
        while self._threads < threads:
            threading.Thread(target=self._serve, name="read-ahead", daemon=True).start()
            self._threads += 1
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((path, future))
        return future

    def close(self) -> None:
        """Reads not started are dropped; each thread ends after its read in flight."""
        self._closed = True
        for _ in range(self._threads):
            self._queue.put(None)

    def _serve(self) -> None:
        while (job := self._queue.get()) is not None:
            path, future = job
            if self._closed or not future.set_running_or_notify_cancel():
                continue
            started = time.perf_counter()
            data = read_file(path)
            future.set_result((data, time.perf_counter() - started))


_readers = threading.local()  # per thread: Beam's runners may run several bundles in one process


def process_reader(depth: int | None) -> FileReader:
    """This thread's reader for the setting `depth`, kept for the tasks that follow (a forked worker
    starts with none of its parent's)."""
    key = (os.getpid(), depth)
    if getattr(_readers, "key", None) != key:
        _readers.key, _readers.reader = key, FileReader(depth)
    return _readers.reader
