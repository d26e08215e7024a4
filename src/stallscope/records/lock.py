"""An exclusive lock on an output directory, so two conversions never write into it at once.

`fcntl.flock` is released by the kernel when the last descriptor of the locked file closes. A process
forked while the lock is held (a worker of the pool) would inherit a descriptor and keep the lock
after its parent died, so every held lock's descriptor is closed in a forked child at once. The
lock file names its holder (PID, host, and the PID's start time, so a reused PID is not taken for
it): a refused run says who holds it, and where that holder is a process of this host that no longer
runs, the lock (still held through a descriptor some orphan kept: a worker left by an older version,
say) is taken over: the file is replaced, under a second lock so that two runs never both replace it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

from stallscope.errors import StallscopeError

log = logging.getLogger(__name__)

LOCK_NAME = "lock"
TAKEOVER_SUFFIX = ".takeover"  # the lock that serialises taking over a dead holder's lock
TAKEOVER_WAIT_S = 5.0  # another run taking over holds it for milliseconds
_ATTEMPTS = 3  # the lock file replaced between opening and locking it: try the new one


class LockedError(StallscopeError):
    """Another process holds the lock."""


_HELD: "weakref.WeakSet[ExclusiveLock]" = weakref.WeakSet()


def _forget_in_child() -> None:
    """In a forked child: close the inherited descriptors of held locks, so that the lock ends with
    the process that took it, not with the last of its children."""
    for lock in list(_HELD):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def process_started(pid: int) -> str | None:
    """When `pid` started, in clock ticks since boot (Linux /proc), or None where it cannot be told."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()  # after the command name, which may hold spaces
    return fields[19].decode() if len(fields) > 19 else None


def holder_text(pid: int | None = None) -> str:
    """What a lock file says of its holder: `PID N on host H`, then a line with the PID's start time."""
    pid = os.getpid() if pid is None else pid
    return f"PID {pid} on host {socket.gethostname()}\nstarted {process_started(pid) or '?'}\n"


def _dead_holder(text: str) -> int | None:
    """The PID a lock file names, where it is a process of this host that no longer runs (or a later
    process under its PID); None where it runs, belongs to another host, or the text says no PID."""
    lines = text.splitlines()
    words = lines[0].split() if lines else []
    if len(words) != 5 or words[0] != "PID" or not words[1].isdigit() or words[2:4] != ["on", "host"]:
        return None
    if words[4] != socket.gethostname():
        return None  # another host's process: only that host can tell
    pid = int(words[1])
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except PermissionError:
        pass  # someone else's process: running
    started = lines[1].split()[-1] if len(lines) > 1 and lines[1].startswith("started ") else "?"
    now = process_started(pid)
    return pid if started != "?" and now is not None and now != started else None


def _same_file(fd: int, path: Path) -> bool:
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _others_holding(fd: int) -> list[int]:
    """Processes other than this one with the file of `fd` open (Linux /proc; those of this user)."""
    here = os.fstat(fd)
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            for link in os.scandir(f"/proc/{entry.name}/fd"):
                there = os.stat(link.path)
                if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino):
                    found.append(int(entry.name))
                    break
        except OSError:
            continue  # gone, or not ours to look at
    return found


class ExclusiveLock:
    """The lock as an object, for a holder that takes and frees it in separate steps (each bounded on a
    network file system: `storage/mounts.NetworkGuard`)."""

    def __init__(self, path: Path, *, what: str) -> None:
        self.path, self.what = Path(path), what
        self._fd: int | None = None
        self.named = False  # whether the file names this holder yet (a full disk may refuse it at first)

    def acquire(self) -> "ExclusiveLock":
        for _ in range(_ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 200, 0).decode("utf-8", "replace")
                taken_over = _dead_holder(text) is not None and self._take_over(fd, text)
                os.close(fd)
                if taken_over:
                    continue
                holder = text.strip().splitlines()[0] if text.strip() else "another process"
                raise LockedError(f"{self.what} is already running ({holder}); wait for it to finish or stop it") from None
            except BaseException:
                os.close(fd)
                raise
            if not _same_file(fd, self.path):  # replaced or removed while this run waited to lock it
                os.close(fd)
                continue
            self._fd = fd
            _HELD.add(self)
            try:
                self.name_holder()
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    self.release()
                    raise
                log.info("%s: held, but a full disk leaves it unnamed for now", self.path)
            except BaseException:
                self.release()
                raise
            if not _same_file(fd, self.path):  # a run taking over a dead holder's lock removed it as it was locked
                self.release()
                continue
            return self
        raise LockedError(f"{str(self.path)!r}: the lock was replaced {_ATTEMPTS} times while this run tried to "
                          "take it (other runs starting at the same moment); expected it to settle: try again")

    def _take_over(self, fd: int, text: str) -> bool:
        """Removes a lock file whose holder no longer runs, so the next attempt makes and locks a new one;
        False where another run took it over first or holds the takeover for TAKEOVER_WAIT_S."""
        guard = os.open(self.path.with_name(self.path.name + TAKEOVER_SUFFIX), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + TAKEOVER_WAIT_S
            while True:
                try:
                    fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.01)
            if not _same_file(fd, self.path):
                return True  # another run replaced it already: lock the new one
            left = _others_holding(fd)
            if os.pread(fd, 200, 0).decode("utf-8", "replace") != text:
                return False  # a new holder wrote its name (or emptied it to) since
            log.warning("%s: taking over the lock of %s, which no longer runs%s", self.path,
                        text.splitlines()[0],
                        f"; processes {', '.join(map(str, left))} it left behind still hold the old lock file"
                        if left else "")
            self.path.unlink(missing_ok=True)
            return True
        finally:
            os.close(guard)

    def name_holder(self) -> None:
        """Writes this process into the held lock file, where it is not yet (after a full disk has been
        cleared of a dead run's files, say), so that a refused run can say who holds it."""
        if self._fd is not None and not self.named:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, holder_text().encode(), 0)
            self.named = True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            _HELD.discard(self)
            os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def exclusive_lock(path: Path, *, what: str) -> Iterator[None]:
    """Holds an exclusive lock on `path` for the block; `what` names the guarded work in the refusal."""
    lock = ExclusiveLock(path, what=what).acquire()
    try:
        yield
    finally:
        lock.release()
