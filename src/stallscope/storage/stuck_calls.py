"""A watch on the file calls TensorFlow makes itself on a network file system.

stallscope's own steps on a network file system are bounded (`mounts.NetworkGuard`), but TF's reads
(`tf.io.read_file`, a TFRecord reader, a checkpoint write) happen in C++ threads with no timeout: a
server that stops answering hangs training for good. Linux shows each thread's current system call
and its arguments in /proc/self/task/TID/syscall. A thread found in the same file call with the same
arguments (the same descriptor, buffer and offset) for the whole storage timeout, on a file of a
network file system, is waiting on a server that has not answered; `StuckCallWatch` hands it to its
`on_stuck`. A reader that is merely slow moves on to other offsets between samples and never counts.
On NFS the server's answers are counted too (/proc/self/mountstats): a call that waits while the
server goes on answering the mount's requests (a close that flushes a large checkpoint over a slow link)
is not stuck. Elsewhere a single call that takes the whole timeout to move its bytes (one read of a
gigabyte through a FUSE mount over a slow link) does count: raise --storage-timeout for such files.

Only Linux on x86-64 and arm64, whose call numbers are below; elsewhere the watch does not start.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from stallscope.storage.mounts import is_within, network_file_system, silence_line, unescape
from stallscope.watchdog import Watchdog

log = logging.getLogger(__name__)

TASKS = Path("/proc/self/task")
MOUNTSTATS = Path("/proc/self/mountstats")
MEMORY = "/proc/self/mem"
_AT_FDCWD = 0xFFFFFFFFFFFFFF9C  # -100 as the kernel prints a call's argument

# name -> (x86-64 number, arm64 number); the first argument is a descriptor, or a directory's (*at)
_FD_CALLS = {
    "read": (0, 63), "write": (1, 64), "close": (3, 57), "fstat": (5, 80), "lseek": (8, 62),
    "pread64": (17, 67), "pwrite64": (18, 68), "readv": (19, 65), "writev": (20, 66),
    "fsync": (74, 82), "fdatasync": (75, 83), "getdents64": (217, 61), "preadv": (295, 69),
    "pwritev": (296, 70), "preadv2": (327, 286), "pwritev2": (328, 287),
}
_PATH_CALLS = {  # the path is in the caller's memory; the *at ones name a directory by descriptor
    "openat": (257, 56), "newfstatat": (262, 79), "faccessat": (269, 48), "statx": (332, 291),
    "openat2": (437, 437), "open": (2, None), "stat": (4, None), "lstat": (6, None), "access": (21, None),
}
_WRITES = {"write", "pwrite64", "writev", "pwritev", "pwritev2", "fsync", "fdatasync", "close"}
_OPENS = {"openat", "openat2", "open"}
_NO_FOLDER = {"open", "stat", "lstat", "access"}  # these take the path first and look it up from the working folder


def _numbers(table: dict[str, tuple[int, int | None]]) -> dict[int, str]:
    column = {"x86_64": 0, "amd64": 0, "aarch64": 1, "arm64": 1}.get(platform.machine().lower())
    if column is None:
        return {}
    return {numbers[column]: name for name, numbers in table.items() if numbers[column] is not None}


@dataclasses.dataclass(frozen=True)
class StuckCall:
    """A thread's file call that has not returned for `seconds`: `path` is the file, or, where a call
    naming its file by a path could not be read (`file_known` False), the folder it is looked up from
    ('' when that is the working folder)."""

    call: str
    path: str
    fstype: str
    seconds: float
    file_known: bool = True

    @property
    def doing(self) -> str:
        """What the call was doing, for a message: "reading '/mnt/nfs/data/cat/1.jpg'"."""
        if self.call in _PATH_CALLS:
            verb = "opening" if self.call in _OPENS else "looking up"
            if self.file_known:
                return f"{verb} {self.path!r}"
            return f"{verb} a file under {self.path!r}" if self.path else f"{verb} a file"
        return f"{'writing' if self.call in _WRITES else 'reading'} {self.path!r}"

    def message(self, timeout_s: float, flag: str = "", limit: str = "--storage-timeout") -> str:
        """The one line: "--dataset_path: the file system (nfs4) reading '...' did not answer for 30 s; ..."."""
        what = f"the file system ({self.fstype}) {self.doing}"
        return silence_line(f"{flag}: {what}" if flag else what, timeout_s, limit=limit)


def end_process(message: str) -> None:
    """The default of `stallscope.watch_storage`: the thread waiting on the server cannot be stopped and
    a normal exit would wait for it, so the process ends here with the line and exit code 2."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.write(2, f"stallscope: {message}\n".encode())
    os._exit(2)


def nfs_replies(mountstats: Path = MOUNTSTATS) -> dict[str, int]:
    """Requests each NFS mount's server has answered so far, by mount point: the sum of the per-op
    counts in /proc/self/mountstats. Empty where there is no NFS mount or no such table."""
    try:
        text = mountstats.read_text()
    except OSError:
        return {}
    replies: dict[str, int] = {}
    mount = None
    for line in text.splitlines():
        if line.startswith("device "):
            fields = line.split()
            nfs = len(fields) >= 8 and fields[2:4] == ["mounted", "on"] and fields[7].startswith("nfs")
            mount = unescape(fields[4]) if nfs else None
            if mount is not None:
                replies[mount] = 0
        elif mount is not None:
            name, _, counts = line.strip().partition(": ")
            answered = counts.split()[:1]
            if name.isupper() and answered and answered[0].isdigit():  # "WRITE: 12 12 0 ...": 12 answered
                replies[mount] += int(answered[0])
    return replies


class StuckCallWatch(Watchdog):
    """Samples this process's threads every `interval_s` on a daemon thread; a file call on a network
    file system unchanged for `timeout_s` goes to `on_stuck` (once). `fallback` (a real path) names where
    a call that names its file by a path relative to the working folder is looked up (a network folder
    the command reads from), for the message."""

    thread_name = "stallscope-file-call-watch"

    def __init__(self, timeout_s: float, on_stuck: Callable[[StuckCall], None], *, fallback: str = "",
                 interval_s: float | None = None, replies: Callable[[], dict[str, int]] = nfs_replies) -> None:
        super().__init__(timeout_s, interval_s)
        self.replies = replies  # answers so far by mount point, where the file system counts them (NFS)
        self._answered: dict[str, tuple[int, float]] = {}  # mount point -> (answers, when they last moved)
        self.on_stuck = on_stuck
        self.fallback = fallback
        self._fd_calls, self._path_calls = _numbers(_FD_CALLS), _numbers(_PATH_CALLS)
        self._seen: dict[str, tuple[str, float, bool]] = {}  # thread id -> (its call line, since when, judged local)

    @staticmethod
    def available() -> bool:
        return bool(_numbers(_FD_CALLS)) and TASKS.is_dir()

    def can_watch(self) -> bool:
        return self.available()

    def check(self) -> bool:
        stuck = self.sample(exclude=str(threading.get_native_id()))  # not the watch's own thread
        if stuck is not None:
            self.on_stuck(stuck)
            return True
        return False

    def sample(self, exclude: str = "") -> StuckCall | None:
        """One look at every thread; the first call found stuck, if any."""
        now = time.monotonic()
        seen: dict[str, tuple[str, float, bool]] = {}
        found = None
        answered = {}
        for mount, count in self.replies().items():
            earlier = self._answered.get(mount)
            answered[mount] = earlier if earlier is not None and earlier[0] == count else (count, now)
        self._answered = answered
        try:
            threads = os.listdir(TASKS)
        except OSError:
            return None
        for tid in threads:
            if tid == exclude:
                continue
            line = _call_line(tid)
            if line is None:
                continue
            number = int(line.split(" ", 1)[0])
            if number not in self._fd_calls and number not in self._path_calls:
                continue
            earlier = self._seen.get(tid)
            same = earlier is not None and earlier[0] == line
            since, local = (earlier[1], earlier[2]) if same else (now, False)
            if found is None and not local and now - since >= self.timeout_s:
                found = self._judge(line, number, now - since)
                local = found is None  # a pipe, a socket, a local file: not looked at again while it waits
                if found is not None and self._server_answering(found.path or self.fallback, now):
                    found = None  # the call waits, but on a server that is answering: slow, not stuck
            seen[tid] = (line, since, local)
        self._seen = seen
        return found

    def _server_answering(self, path: str, now: float) -> bool:
        """Whether the server of the counted mount holding `path` has answered within the timeout."""
        mounts = [m for m in self._answered if is_within(path, m)]
        if not mounts:
            return False
        return now - self._answered[max(mounts, key=len)][1] < self.timeout_s

    def _judge(self, line: str, number: int, seconds: float) -> StuckCall | None:
        """The stuck call where it is on a network file system; None where the file is local (a pipe, a
        socket, a local disk: not the storage timeout's to judge)."""
        # Every path judged here is absolute and judged as written (the kernel's own names, and a call's
        # path joined to its folder), so judging it makes no call to the file system that may be the one
        # not answering.
        first = int(line.split()[1], 16)
        if number in self._fd_calls:
            path = _fd_path(first)
            fstype = network_file_system(path, resolved=True) if path.startswith("/") else None
            return StuckCall(self._fd_calls[number], path, fstype, seconds) if fstype else None
        call = self._path_calls[number]
        arguments = [int(field, 16) for field in line.split()[1:]]
        folder = "" if call in _NO_FOLDER or first == _AT_FDCWD else _fd_path(first)
        name = _own_string(arguments[0] if call in _NO_FOLDER else arguments[1])
        named = os.path.normpath(os.path.join(folder or os.getcwd(), name)) if name is not None else ""
        # The file as named judges first; named through a link it may look local, so the folder it is
        # looked up from (for the working folder, the network folder the command was given) judges next.
        for path in (named, folder or self.fallback or os.getcwd()):
            fstype = network_file_system(path, resolved=True) if path.startswith("/") else None
            if fstype:
                if named:
                    return StuckCall(call, named, fstype, seconds)
                return StuckCall(call, folder or self.fallback, fstype, seconds, file_known=False)
        return None

def _own_string(address: int, limit: int = 4096) -> str | None:
    """The NUL-ended string at `address` in this process's memory (a stuck call's path argument), read
    through /proc/self/mem, which answers an unmapped address with an error instead of a crash. None
    where it cannot be read."""
    if not address:
        return None
    try:
        with open(MEMORY, "rb", buffering=0) as memory:
            text = b""
            while len(text) < limit:
                memory.seek(address + len(text))
                page_left = 4096 - (address + len(text)) % 4096  # a read past a mapped page fails whole
                chunk = memory.read(page_left)
                if not chunk:
                    return None
                end = chunk.find(b"\0")
                if end >= 0:
                    return os.fsdecode(text + chunk[:end])
                text += chunk
    except (OSError, OverflowError, ValueError):
        return None
    return None


def _call_line(tid: str) -> str | None:
    """The thread's call and its six arguments ("17 0x5 0x7f.. 0x2000 0x0 0x0 0x0"); None when it is
    running or not in a call."""
    try:
        text = (TASKS / tid / "syscall").read_text()
    except OSError:  # the thread has ended
        return None
    fields = text.split()
    if len(fields) < 7 or not fields[0].isdigit():
        return None  # "running", or "-1 sp pc" (not in a call)
    return " ".join(fields[:7])


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""
