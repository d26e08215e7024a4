"""Which file system a local path is on, from /proc/self/mountinfo (Linux).

A network file system (NFS, SMB, a FUSE mount of a bucket or of a remote host) answers each open and
read with one or more round trips, and a server that stops answering can hold a read forever: readers
of such a path keep their reads ahead and bound their waits (`records/read_ahead.py`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Kernel file system types whose bytes live on another machine. "fuse.<name>" (gcsfuse, s3fs, sshfs,
# mountpoint-s3, `stallscope storage serve --mount`) counts too; "fuseblk" (ntfs-3g on a local disk) not.
NETWORK_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "afs",
    "orangefs", "fuse",
})
MOUNTINFO = Path("/proc/self/mountinfo")


def unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as an octal escape."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_points(text: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of each line of a mountinfo text."""
    found = []
    for line in text.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) >= 5 and tail:
            found.append((unescape(fields[4]), tail[0]))
    return found


def file_system_type(path: str | os.PathLike, mountinfo: Path = MOUNTINFO) -> str | None:
    """The type of the file system `path` is on (the mount with the longest mount point above it);
    None where the table cannot be read (not Linux)."""
    try:
        mounts = mount_points(mountinfo.read_text())
    except OSError:
        return None
    where = os.path.realpath(path)
    best = None
    for point, fstype in mounts:  # a later mount over the same point hides the earlier one
        if where == point or where.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= len(best[0]):
                best = (point, fstype)
    return best[1] if best else None


def is_network_type(fstype: str | None) -> bool:
    return fstype is not None and (fstype in NETWORK_TYPES or fstype.startswith("fuse."))


def network_file_system(path: str | os.PathLike) -> str | None:
    """The type of the network file system `path` is on ("nfs4", "fuse.gcsfuse"), or None."""
    fstype = file_system_type(path)
    return fstype if is_network_type(fstype) else None


def watched(work: Callable[[], T], progress: Callable[[], int] | None, what: str, unit: str = "files") -> T:
    """`work()` on a daemon thread, waited for while `progress()` (a count the work raises as it goes)
    moves at least once each storage timeout; otherwise a StorageError: `what` did not answer. Without
    `progress`, the whole of `work` must end within the timeout. For work on a network file system (a
    listing, a write, an fsync) whose calls have no timeout of their own: a server that stops answering
    leaves the thread behind, never the process."""
    from stallscope.storage.location import StorageError, storage_timeout

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
            raise StorageError(f"{what} did not answer for {timeout_s:g} s{after}; "
                               "expected it within --storage-timeout")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
