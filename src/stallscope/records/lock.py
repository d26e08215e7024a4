"""An exclusive lock on an output directory, so two conversions never write into it at once.

`fcntl.flock` is released by the kernel when its holder dies, however it dies, so a lock left by a
killed run never blocks the next one; the holder's PID and host are written into the lock file only
so that a refused run can say who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from stallscope.errors import StallscopeError

LOCK_NAME = "lock"


class LockedError(StallscopeError):
    """Another process holds the lock."""


class ExclusiveLock:
    """The lock as an object, for a holder that takes and frees it in separate steps (each bounded on a
    network file system: `storage/mounts.NetworkGuard`)."""

    def __init__(self, path: Path, *, what: str) -> None:
        self.path, self.what = path, what
        self._fd: int | None = None

    def acquire(self) -> "ExclusiveLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise LockedError(f"{self.what} is already running ({holder}); wait for it to finish or stop it") from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"PID {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def exclusive_lock(path: Path, *, what: str) -> Iterator[None]:
    """Holds an exclusive lock on `path` for the block; `what` names the guarded work in the refusal."""
    lock = ExclusiveLock(path, what=what).acquire()
    try:
        yield
    finally:
        lock.release()
