"""A read-only FUSE passthrough mount of a folder that pays a latency per open, per read and per
directory listing: a network file system for any reader (PIL, tf.io, a shell), with no NFS server.

Needs /dev/fuse and libfuse3 (Debian `fuse3`) and the `mfusepy` binding. The file system runs
multithreaded, so reads in flight overlap their waits as they would on a network.
"""

from __future__ import annotations

import ctypes.util
import errno
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from stallscope.storage.counters import SharedCounters
from stallscope.storage.latency_proxy import Throttle

log = logging.getLogger(__name__)


def why_no_fuse() -> str:
    """'' when a FUSE mount can be made here; otherwise what is missing, in words."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine (FUSE needs the kernel module and the device)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse cannot be opened by this user"
    if not ctypes.util.find_library("fuse3"):
        return "libfuse3 is not installed (Debian/Ubuntu: apt-get install fuse3)"
    if not shutil.which("fusermount3"):
        return "fusermount3 is not installed (Debian/Ubuntu: apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"the mfusepy package cannot be loaded ({exc}); pip install 'stallscope[storage]'"
    return ""


def _operations_class():
    import mfusepy

    class SlowPassthrough(mfusepy.Operations):
        """Passthrough of `root`, read-only, with `latency_s` per open, read and listing."""

        use_ns = True

        def __init__(self, root: Path, latency_s: float, throttle: Throttle | None, counters: SharedCounters):
            self.root = str(root)
            self.latency_s = latency_s
            self.throttle = throttle
            self.counters = counters

        def _real(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def _wait(self) -> None:
            if self.latency_s:
                time.sleep(self.latency_s)

        def getattr(self, path, fh=None):
            try:
                status = os.lstat(self._real(path))
            except OSError as exc:
                raise mfusepy.FuseOSError(exc.errno) from None
            attributes = {key: getattr(status, key) for key in (
                "st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
            for key in ("st_atime", "st_mtime", "st_ctime"):
                attributes[key] = attributes.pop(key + "_ns")
            attributes["st_mode"] &= ~0o222  # read-only
            return attributes

        def readdir(self, path, fh):
            self._wait()
            self.counters.add(requests=1, lists=1)
            try:
                return [".", ".."] + sorted(os.listdir(self._real(path)))
            except OSError as exc:
                raise mfusepy.FuseOSError(exc.errno) from None

        def readlink(self, path):
            return os.readlink(self._real(path))

        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT):
                raise mfusepy.FuseOSError(errno.EROFS)
            self._wait()
            try:
                handle = os.open(self._real(path), os.O_RDONLY)
            except OSError as exc:
                self.counters.add(requests=1, errors=1)
                raise mfusepy.FuseOSError(exc.errno) from None
            self.counters.add(requests=1, connections=1)
            return handle

        def read(self, path, size, offset, fh):
            self._wait()
            data = os.pread(fh, size, offset)
            if self.throttle and data:
                self.throttle.wait(len(data))
            self.counters.add(requests=1, bytes=len(data))
            return data

        def release(self, path, fh):
            os.close(fh)
            return 0

        def statfs(self, path):
            status = os.statvfs(self._real(path))
            return {key: getattr(status, key) for key in (
                "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
                "f_frsize", "f_namemax")}

        def access(self, path, amode):
            if amode & os.W_OK:
                raise mfusepy.FuseOSError(errno.EROFS)
            if not os.access(self._real(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

    return SlowPassthrough


class FuseMount:
    """Mounts `root` at `mount_point` in a background thread; `unmount()` ends it.

    The caller's signal handlers stay in place (libfuse only installs its own where none is set),
    so SIGINT/SIGTERM reach Python, which unmounts."""

    def __init__(self, root: Path, mount_point: Path, *, latency_s: float, bandwidth_bps: float | None,
                 counters: SharedCounters) -> None:
        self.root, self.mount_point = Path(root).resolve(), Path(mount_point).resolve()
        operations = _operations_class()(self.root, latency_s,
                                         Throttle(bandwidth_bps) if bandwidth_bps else None, counters)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(operations,), daemon=True, name="fuse")

    def _run(self, operations) -> None:
        import mfusepy

        try:
            mfusepy.FUSE(operations, str(self.mount_point), foreground=True, ro=True,
                         fsname="stallscope-storage", default_permissions=True)
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not os.path.ismount(self.mount_point):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.unmount()
                raise OSError(f"the FUSE mount at {self.mount_point} did not come up"
                              + (f": {self._error}" if self._error else ""))
            time.sleep(0.02)

    def unmount(self, timeout_s: float = 10.0) -> None:
        if os.path.ismount(self.mount_point):
            result = subprocess.run(["fusermount3", "-u", "-z", str(self.mount_point)],
                                    capture_output=True, text=True, timeout=timeout_s)
            if result.returncode:
                log.warning("fusermount3 -u %s: %s", self.mount_point, result.stderr.strip())
        self._thread.join(timeout_s)
