"""The processes answering a FUSE mount's requests on this host (gcsfuse, mountpoint-s3, s3fs-fuse,
rclone, stallscope's own emulated mount): every open and read of a FUSE mount is served by one of them on
this machine's cores, so their CPU competes with the pipeline's, as a remote NFS server's does not.

They are found by the /dev/fuse they hold open. Another user's processes may not be readable without
privileges: then they are not found, and the caller says so.
"""

from __future__ import annotations

import dataclasses
import os

import psutil

FUSE_DEVICE = "/dev/fuse"


def fuse_daemons() -> tuple[int, ...]:
    """PIDs of the processes holding /dev/fuse open, this one included where it serves a mount itself."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with os.scandir(f"/proc/{entry.name}/fd") as fds:
                if any(_points_to_fuse(fd.path) for fd in fds):
                    found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return tuple(found)


def _points_to_fuse(path: str) -> bool:
    try:
        return os.readlink(path) == FUSE_DEVICE
    except OSError:
        return False


def cpu_seconds(pids: tuple[int, ...]) -> float:
    """User and system CPU seconds the processes have used so far (0 for one that has gone)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


@dataclasses.dataclass
class DaemonClock:
    """The CPU of the FUSE daemons of other processes between `start()` and `seconds()`; `own`: this
    process serves a mount itself (its CPU is in the process's own figures already)."""

    pids: tuple[int, ...] = ()
    own: bool = False
    started: float = 0.0

    def start(self) -> "DaemonClock":
        found = fuse_daemons()
        self.own = os.getpid() in found
        self.pids = tuple(pid for pid in found if pid != os.getpid())
        self.started = cpu_seconds(self.pids)
        return self

    def seconds(self) -> float:
        return max(0.0, cpu_seconds(self.pids) - self.started)
