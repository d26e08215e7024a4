"""Child processes that end with their parent, and PIDs told apart from later processes that reuse them.

A child waiting on a pipe or a socket its siblings also hold never sees its parent end, so a killed
parent (SIGKILL runs no handler) left workers asleep for good. The kernel is asked to signal the child
when its parent ends (Linux: PR_SET_PDEATHSIG); a child whose parent ended before it asked exits at
once. Each caller picks its signal: SIGKILL where nothing needs saying (convert's workers), SIGTERM or
SIGINT where the child has something to write on its way out (a service worker, a sweep's run).

A PID alone does not name a process for long: once it ends, the kernel may hand the number to another.
Whoever records a PID to judge later (a lock, a lease, a state folder's marker) records its start time
too, and a PID now running under another start time counts as gone.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Start times are read from /proc in clock ticks and turned into seconds since the epoch; the same
# process read twice agrees to far better than this.
SAME_START_S = 1.0


@functools.cache
def _prctl():
    """libc's prctl, looked up once (a forked child then loads nothing); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL, *, exit_code: int = 1) -> None:
    """In a child, first thing: the kernel sends `sig` when the parent ends; an exit with `exit_code`
    now if it has ended already (this process was re-parented). The signal follows the parent's
    thread that started this process."""
    prctl = _prctl()
    if prctl is not None and prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        import ctypes

        log.warning("could not ask to end with the parent process: %s", os.strerror(ctypes.get_errno()))
    if os.getppid() != parent_pid:
        os._exit(exit_code)


def dying_with_parent(sig: int, *, exit_code: int = 1) -> Callable[[], None] | None:
    """A `subprocess.Popen` preexec_fn doing `die_with_parent(this process, sig)` in the child before
    it runs its program; None where there is no prctl. prctl is looked up here, in the parent, so the
    forked child calls only async-signal-safe code."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent_pid = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(exit_code)

    return arm


def start_time(pid: int) -> float | None:
    """When `pid` started, in seconds since the epoch; None where no such process runs (or it may not be read)."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
        return None


def still_running(pid: int, started: float | None) -> bool:
    """Whether the process recorded as `pid`, started at `started` (None: not recorded), still runs:
    False where the PID is free, or held by a process that started at another time (a reused PID)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        now = process.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError):
        return False
    except psutil.AccessDenied:
        return True  # someone else's process, which runs
    return started is None or abs(now - float(started)) <= SAME_START_S


MARKER = "made-by.json"  # in a marked folder: {"pid": ..., "started": ...} of the process that made it


def marked_folder(prefix: str) -> Path:
    """A fresh folder in the temporary folder named `prefix...`, marked with this process as its maker
    (PID and start time), for `clear_dead_marked_folders` to judge once a `kill -9` has left it behind."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    (folder / MARKER).write_text(json.dumps({"pid": os.getpid(), "started": start_time(os.getpid())}),
                                 encoding="utf-8")
    return folder


def maker_gone(folder: Path) -> bool:
    """The folder's marker names a process that no longer runs (or whose PID another process now has);
    False where there is no marker of ours to judge by."""
    try:
        made = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        pid, started = int(made["pid"]), made.get("started")
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return not still_running(pid, started)


def clear_dead_marked_folders(prefix: str, who: str, root: Path | None = None) -> list[Path]:
    """Removes the marked folders `prefix...` in `root` (the temporary folder) whose maker is gone, and
    returns them; nothing else there, even with the same prefix, is touched. `who` names the maker in
    the log line ("a storage emulator")."""
    root = Path(root or tempfile.gettempdir())
    cleared: list[Path] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return cleared
    for folder in candidates:
        if maker_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            cleared.append(folder)
            log.info("removed %s, left by %s that was killed", folder, who)
    return cleared
