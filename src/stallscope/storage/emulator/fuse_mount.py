"""A FUSE passthrough mount of a folder that pays a latency per open, per read and per directory
listing: a network file system for any reader (PIL, tf.io, a shell), with no NFS server. Read-only
unless `writable`; then every create, write, fsync, rename, mkdir and unlink pays the latency too, as
each is a round trip to an NFS server (what a converter writing to a network file system meets). Writes
are cached by the kernel and sent in the background, as an NFS client's are.

Needs /dev/fuse and libfuse3 (Debian `fuse3`) and the `mfusepy` binding. The file system runs
multithreaded, so reads in flight overlap their waits as they would on a network.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from stallscope.extras import install_line
from stallscope.storage.emulator.counters import SharedCounters
from stallscope.storage.emulator.latency_proxy import Throttle

log = logging.getLogger(__name__)

# Calls the mount serves at once: libfuse's threads (its default, 10, is what mfusepy's out-of-range
# request falls back to) and the kernel's read-ahead requests in flight (max_background, default 12).
# With 10 ms a call, 64 files read at once went from ~865 calls/s to ~3,100 on 2 cores.
MOUNT_THREADS = 64
# The mount's source name in /proc/self/mountinfo: this prefix and the counters file, so a reader of
# the mount finds the store's counters (storage/served_counters.py).
MOUNT_SOURCE_PREFIX = "stallscope-storage:"


def mount_source(counters: SharedCounters) -> str:
    """'stallscope-storage:COUNTERS_FILE', or the bare name where the path cannot be a mount option."""
    path = str(counters.path) if getattr(counters, "path", None) else ""
    if not path or any(char in path for char in ", \t\n\\"):
        return MOUNT_SOURCE_PREFIX.rstrip(":")
    return MOUNT_SOURCE_PREFIX + path


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
        return f"the mfusepy package cannot be loaded ({exc}); {install_line('emulator')}"
    return ""


# What a write-side open passes on to the folder below (access mode and how to write; not O_DIRECT and the like).
_PASSED_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_EXCL | os.O_CREAT
_WRITEBACK_CACHE = 1 << 16  # libfuse 3's FUSE_CAP_WRITEBACK_CACHE


def _fuse_error(code: int) -> Exception:
    """The error a FUSE call answers with (mfusepy is loaded by then: the mount runs on it)."""
    import mfusepy

    return mfusepy.FuseOSError(code)


class _Passthrough:
    """The folder below and what every call pays: its path for a mount path, the latency, the counts."""

    use_ns = True

    def __init__(self, root: Path, latency_s: float, throttle: Throttle | None, counters: SharedCounters,
                 writable: bool = False):
        self.root = str(root)
        self.latency_s = latency_s
        self.throttle = throttle
        self.counters = counters
        self.writable = writable

    def _real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _wait(self) -> float:
        """Holds the call for the latency; returns when it arrived, for `_served`."""
        arrived = time.monotonic()
        if self.latency_s:
            time.sleep(self.latency_s)
        return arrived

    def _served(self, arrived: float) -> None:
        """Counts the call's time at the store, from its arrival to its answer, in the latency histogram."""
        self.counters.observe(time.monotonic() - arrived)


class _ReadCalls(_Passthrough):
    """The calls a reader makes: stat, list, open, read, close; an open for writing refused unless writable."""

    def getattr(self, path, fh=None):
        try:
            status = os.lstat(self._real(path))
        except OSError as exc:
            raise _fuse_error(exc.errno) from None
        attributes = {key: getattr(status, key) for key in (
            "st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
        for key in ("st_atime", "st_mtime", "st_ctime"):
            attributes[key] = attributes.pop(key + "_ns")
        if not self.writable:
            attributes["st_mode"] &= ~0o222
        return attributes

    def readdir(self, path, fh):
        arrived = self._wait()
        self.counters.add(requests=1, lists=1)
        try:
            return [".", ".."] + sorted(os.listdir(self._real(path)))
        except OSError as exc:
            raise _fuse_error(exc.errno) from None
        finally:
            self._served(arrived)

    def readlink(self, path):
        return os.readlink(self._real(path))

    def open(self, path, flags):
        writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT)
        if writes and not self.writable:
            raise _fuse_error(errno.EROFS)
        arrived = self._wait()
        try:
            handle = os.open(self._real(path), _write_flags(flags) if writes else os.O_RDONLY)
        except OSError as exc:
            self.counters.add(requests=1, errors=1)
            raise _fuse_error(exc.errno) from None
        self.counters.add(requests=1, connections=1)
        self._served(arrived)
        return handle

    def read(self, path, size, offset, fh):
        arrived = self._wait()
        data = os.pread(fh, size, offset)
        if self.throttle and data:
            self.throttle.wait(len(data))
        self.counters.add(requests=1, bytes=len(data))
        self._served(arrived)
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
        if amode & os.W_OK and not self.writable:
            raise _fuse_error(errno.EROFS)
        if not os.access(self._real(path), amode):
            raise _fuse_error(errno.EACCES)
        return 0


class _WriteCalls(_Passthrough):
    """The calls that change the tree (create, write, truncate, fsync, rename, unlink, mkdir, rmdir,
    chmod, utimens): each refused on a read-only mount, else a request that pays the latency."""

    def init_with_config(self, conn, config) -> None:
        """A writable mount caches writes in the kernel and sends them to the daemon in the
        background, several in flight, as an NFS client does: without it every write() waits for
        its own requests in turn, which made the emulator far slower to write to than NFS."""
        if self.writable and conn is not None and conn.capable & _WRITEBACK_CACHE:
            conn.want |= _WRITEBACK_CACHE
        if conn is not None:  # the kernel's read-ahead in flight at once (its default, 12, queued the rest)
            conn.max_background = MOUNT_THREADS
            conn.congestion_threshold = MOUNT_THREADS * 3 // 4

    def _change(self, call, *args):
        """One write-side request: refused on a read-only mount, else waited for and passed on."""
        if not self.writable:
            raise _fuse_error(errno.EROFS)
        arrived = self._wait()
        self.counters.add(requests=1)
        try:
            return call(*args)
        except OSError as exc:
            self.counters.add(errors=1)
            raise _fuse_error(exc.errno) from None
        finally:
            self._served(arrived)

    def create(self, path, mode, flags=os.O_WRONLY):
        self.counters.add(connections=1)
        return self._change(os.open, self._real(path), _write_flags(flags) | os.O_CREAT, mode)

    def write(self, path, data, offset, fh):
        return self._change(os.pwrite, fh, data, offset)

    def truncate(self, path, length, fh=None):
        self._change(os.truncate, fh if fh is not None else self._real(path), length)
        return 0

    def fsync(self, path, datasync, fh):
        self._change(os.fdatasync if datasync else os.fsync, fh)
        return 0

    def rename(self, old, new):
        self._change(os.rename, self._real(old), self._real(new))
        return 0

    def unlink(self, path):
        self._change(os.unlink, self._real(path))
        return 0

    def mkdir(self, path, mode):
        self._change(os.mkdir, self._real(path), mode)
        return 0

    def rmdir(self, path):
        self._change(os.rmdir, self._real(path))
        return 0

    def chmod(self, path, mode):
        self._change(os.chmod, self._real(path), mode)
        return 0

    def utimens(self, path, times=None):
        real = self._real(path)
        self._change(lambda: os.utime(real) if times is None else os.utime(real, ns=tuple(times)))
        return 0


def _write_flags(flags: int) -> int:
    """With the kernel's write cache it may read pages of a file opened write-only, and it places
    appends itself: the daemon's own handle is opened read-write, without O_APPEND."""
    flags &= _PASSED_FLAGS
    if flags & os.O_WRONLY:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    return flags & ~os.O_APPEND


def _operations_class():
    """The mount's operations: the read and write calls on mfusepy's base (imported only here, where a
    mount is made), which answers every call they do not define."""
    import mfusepy

    class SlowPassthrough(_ReadCalls, _WriteCalls, mfusepy.Operations):
        """Passthrough of `root` with `latency_s` per open, read and listing (and, `writable`, per write,
        fsync and change of the tree); read-only otherwise."""

    return SlowPassthrough


# libfuse 3.14 logs this at every multithreaded mount (its check of the idle-thread count it was handed
# misreads "unset"; fixed in 3.16): it would be the first line `storage serve --mount` prints. Nothing is wrong.
_HARMLESS_LIBFUSE_LINE = b"Ignoring invalid max threads value"
_log_function: list = []  # the installed callback, kept alive for as long as libfuse may call it


def _quiet_libfuse(libfuse) -> None:
    """Routes libfuse's log through a filter that drops `_HARMLESS_LIBFUSE_LINE` and prints every other
    line as libfuse would (vfprintf to stderr). Once per process; where the library lacks the hook
    (libfuse 2), its lines stay as they are."""
    if _log_function or not hasattr(libfuse, "fuse_set_log_func"):
        return
    libc = ctypes.CDLL(None)
    stderr = ctypes.c_void_p.in_dll(libc, "stderr")
    libc.vfprintf.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def log_line(level, fmt, args):  # args: the caller's va_list, passed on as it came
        if fmt and not fmt.startswith(_HARMLESS_LIBFUSE_LINE):
            libc.vfprintf(stderr, fmt, args)

    libfuse.fuse_set_log_func.argtypes = (type(log_line),)
    libfuse.fuse_set_log_func(log_line)
    _log_function.append(log_line)


class FuseMount:
    """Mounts `root` at `mount_point` in a background thread; `unmount()` ends it.

    The caller's signal handlers stay in place (libfuse only installs its own where none is set),
    so SIGINT/SIGTERM reach Python, which unmounts."""

    def __init__(self, root: Path, mount_point: Path, *, latency_s: float, bandwidth_bps: float | None,
                 counters: SharedCounters, writable: bool = False) -> None:
        self.root, self.mount_point = Path(root).resolve(), Path(mount_point).resolve()
        self.writable = writable
        operations = _operations_class()(self.root, latency_s,
                                         Throttle(bandwidth_bps) if bandwidth_bps else None, counters, writable)
        self._error: BaseException | None = None
        self._fsname = mount_source(counters)
        self._thread = threading.Thread(target=self._run, args=(operations,), daemon=True, name="fuse")

    def _run(self, operations) -> None:
        import mfusepy

        _quiet_libfuse(mfusepy._libfuse)
        try:
            mfusepy.FUSE(operations, str(self.mount_point), foreground=True, ro=not self.writable,
                         fsname=self._fsname, default_permissions=True, max_threads=MOUNT_THREADS)
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
