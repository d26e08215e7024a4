"""Bounded waits on a folder on a network file system (NFS, SMB, a FUSE mount of a bucket): convert's
output, the shards verify reads, the folders prepare fills.

A server that stops answering holds a write, an fsync, a rename or a lock there forever, and the kernel
gives the writer no timeout of its own. There, each step of a conversion's output runs on a watched
thread (`storage/mounts.watched`) and is given up, with one line naming the file, once it has made no
progress for --storage-timeout; the stuck thread is left behind, never the process. On a local disk
the steps run as they are: no thread, no cost.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import TypeVar

from stallscope.storage.location import StorageError
from stallscope.storage.mounts import network_file_system, watched

log = logging.getLogger(__name__)
T = TypeVar("T")


class Ticks:
    """A count the guarded work raises as it goes (images written, megabytes hashed): its progress.
    `given_up` is set once the guard has given the work up: work that can stop between its steps
    checks it, so a thread left behind does not go on writing once the server answers again."""

    __slots__ = ("count", "given_up")

    def __init__(self) -> None:
        self.count = 0
        self.given_up = False

    def __call__(self) -> int:
        return self.count


@dataclasses.dataclass(frozen=True)
class OutputGuard:
    """Runs steps on a folder bounded where `fstype` (the network file system it is on) is set; `flag`
    names the folder in the error (empty: the caller names it)."""

    fstype: str | None = None
    flag: str = "--output_path"

    @classmethod
    def of(cls, path: str | os.PathLike, flag: str = "--output_path") -> "OutputGuard":
        return cls(network_file_system(path), flag)

    def __call__(self, work: Callable[[], T], what: str, progress: Callable[[], int] | None = None,
                 unit: str = "images") -> T:
        """`work()`; on a network file system, given up when `progress()` (a count; a `Ticks` is told it
        was given up) has not moved for the storage timeout (without `progress`: when it has not ended by
        then). `what` says what it does to which file."""
        if self.fstype is None:
            return work()
        try:
            prefix = f"{self.flag}: " if self.flag else ""
            return watched(work, progress, f"{prefix}the file system ({self.fstype}) {what}", unit)
        except StorageError:
            if isinstance(progress, Ticks):
                progress.given_up = True
            raise

    def cleanup(self, work: Callable[[], object], what: str) -> None:
        """A step after the output is complete or already failed (closing the lock, removing the state
        folder): a server that does not answer it is logged, never raised over the run's own outcome."""
        try:
            self(work, what)
        except StorageError as exc:
            log.warning("%s; left as it is", exc)
