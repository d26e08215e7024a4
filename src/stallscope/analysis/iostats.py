"""Storage evidence for the differential diagnosis: page-cache control and I/O counters.

A fetch stall is time spent waiting for storage. To show it, `diagnose` runs the pipeline once with
the data set's files in the page cache and once with them evicted (`posix_fadvise(DONTNEED)`, no root
needed), and compares the process's I/O counters: `read_bytes` counts only reads that reached the
storage device, so it is ~0 with a warm cache and ~the data set's size with a cold one.
The counters themselves are read by `workload.resources`, shared with training runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
from collections.abc import Iterable

from stallscope.storage.page_cache import EvictionResult, evict_from_page_cache  # noqa: F401  (probes use them here)
from stallscope.workload.resources import IoPerImage, per_image  # noqa: F401  (diagnose reads them here)

logger = logging.getLogger(__name__)

_PAGE = mmap.PAGESIZE
_READ_CHUNK = 1 << 20


def warm_page_cache(paths: Iterable[str | os.PathLike]) -> int:
    """Reads every file once so that it sits in the page cache; returns the bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(_READ_CHUNK):
                total += len(chunk)
    return total


def _libc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    if not hasattr(libc, "mincore"):
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return libc


_MAP_FAILED = ctypes.c_void_p(-1).value


def cached_pages(path: str | os.PathLike) -> tuple[int, int] | None:
    """(resident pages, total pages) of a file in the page cache, via mmap + mincore.

    None when mincore is unavailable or the answer would be unreliable: since Linux 5.2 the kernel
    reports page-cache residency only for files the caller owns or may write.
    """
    libc = _libc()
    if libc is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    if stat.st_uid != os.geteuid() and not os.access(path, os.W_OK):
        return None
    pages = (stat.st_size + _PAGE - 1) // _PAGE
    if pages == 0:
        return (0, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, stat.st_size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            return None
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), stat.st_size, vec) != 0:
                return None
            return (sum(b & 1 for b in vec), pages)
        finally:
            libc.munmap(ctypes.c_void_p(addr), stat.st_size)
    finally:
        os.close(fd)


def cached_fraction(paths: Iterable[str | os.PathLike]) -> float | None:
    """Share (0..1) of the files' pages that sit in the page cache; None when it cannot be measured."""
    resident = total = 0
    for path in paths:
        answer = cached_pages(path)
        if answer is None:
            return None
        resident += answer[0]
        total += answer[1]
    return resident / total if total else None
