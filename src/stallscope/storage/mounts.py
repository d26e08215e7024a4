"""Which file system a local path is on, from /proc/self/mountinfo (Linux), and bounded waits there.

A network file system (NFS, SMB, a FUSE mount of a bucket or of a remote host) answers each open and
read with one or more round trips, and a server that stops answering can hold a read, a write, an
fsync, a rename or a lock forever: the kernel gives the caller no timeout of its own. Readers of such
a path keep their reads ahead and bound each read (`records/read_ahead.py`); longer steps (a listing,
a shard's writing, prepare's placing) run under a `NetworkGuard`, on a watched thread given up, with
one line naming the file, once it has made no progress for --storage-timeout. The stuck thread is left
behind, never the process. On a local disk the guard runs the step as it is: no thread, no cost.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from stallscope.mountinfo import mounts as parse_mountinfo
from stallscope.mountinfo import unescape  # noqa: F401 (stuck_calls imports it from here)
from stallscope.storage.location import StorageError, is_remote, storage_timeout

log = logging.getLogger(__name__)
T = TypeVar("T")

# Kernel file system types whose bytes live on another machine. "fuse.<name>" (gcsfuse, s3fs, sshfs,
# mountpoint-s3, `stallscope storage serve --mount`) counts too; "fuseblk" (ntfs-3g on a local disk) not.
NETWORK_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "afs",
    "orangefs", "fuse",
})
MOUNTINFO = Path("/proc/self/mountinfo")


def mount_points(text: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of each line of a mountinfo text."""
    return [(mount.point, mount.fstype) for mount in parse_mountinfo(text)]


def is_within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or below it (both absolute, as the kernel names them)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def file_system_type(path: str | os.PathLike, mountinfo: Path = MOUNTINFO, *, resolved: bool = False) -> str | None:
    """The type of the file system `path` is on (the mount with the longest mount point above it);
    None where the table cannot be read (not Linux). `resolved`: the path is already absolute with no
    symbolic link (as the kernel names an open file), so no call goes to the file system itself."""
    try:
        mounts = mount_points(mountinfo.read_text())
    except OSError:
        return None
    where = os.fspath(path) if resolved else os.path.realpath(path)
    best = None
    for point, fstype in mounts:  # a later mount over the same point hides the earlier one
        if is_within(where, point):
            if best is None or len(point) >= len(best[0]):
                best = (point, fstype)
    return best[1] if best else None


def is_network_type(fstype: str | None) -> bool:
    return fstype is not None and (fstype in NETWORK_TYPES or fstype.startswith("fuse."))


def network_file_system(path: str | os.PathLike, *, resolved: bool = False) -> str | None:
    """The type of the network file system `path` is on ("nfs4", "fuse.gcsfuse"), or None."""
    fstype = file_system_type(path, resolved=resolved)
    return fstype if is_network_type(fstype) else None


def watched(work: Callable[[], T], progress: Callable[[], int] | None, what: str, unit: str = "files") -> T:
    """`work()` on a daemon thread, waited for while `progress()` (a count the work raises as it goes)
    moves at least once each storage timeout; otherwise a StorageError: `what` did not answer. Without
    `progress`, the whole of `work` must end within the timeout. For work on a network file system (a
    listing, a write, an fsync) whose calls have no timeout of their own: a server that stops answering
    leaves the thread behind, never the process."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="watched", daemon=True)
    thread.start()
    timeout_s = storage_timeout()
    count = progress or (lambda: 0)
    seen, since = count(), time.monotonic()
    while True:
        thread.join(min(1.0, timeout_s))
        if not thread.is_alive():
            break
        now, now_seen = time.monotonic(), count()
        if now_seen != seen:
            seen, since = now_seen, now
        elif now - since >= timeout_s:
            after = f" (after {seen:,} {unit})" if progress is not None else ""
            raise StorageError(silence_line(what, timeout_s, after))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def silence_line(what: str, timeout_s: float, after: str = "", limit: str = "--storage-timeout") -> str:
    """The one line for a network file system that stopped answering, as text (`deadlines.no_answer` is a
    store's, as a StorageError); `limit` names the setting."""
    return f"{what} did not answer for {timeout_s:g} s{after}; expected it within {limit}"


class Ticks:
    """A count guarded work raises as it goes (files listed, images written, megabytes hashed): its
    progress. `given_up` is set once the guard has given the work up: work that can stop between its
    steps checks it, so a thread left behind does not go on writing once the server answers again."""

    __slots__ = ("count", "given_up")

    def __init__(self) -> None:
        self.count = 0
        self.given_up = False

    def __call__(self) -> int:
        return self.count


@dataclasses.dataclass(frozen=True)
class NetworkGuard:
    """Runs steps on a folder bounded where `fstype` (the network file system it is on) is set; `flag`
    names the folder in the error (empty: the caller names it)."""

    fstype: str | None = None
    flag: str = "--output_path"

    @classmethod
    def of(cls, path: Any, flag: str = "--output_path") -> "NetworkGuard":
        """The guard of a local path; a gs:// or s3:// one has its own timeouts, and needs none."""
        return cls(None if is_remote(path) else network_file_system(path), flag)

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
        """A step after the work is complete or already failed (closing a lock, removing a state
        folder): a server that does not answer it is logged, never raised over the run's own outcome."""
        try:
            self(work, what)
        except StorageError as exc:
            log.warning("%s; left as it is", exc)
