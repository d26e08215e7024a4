"""Early write-back of a file being written: the kernel starts putting its bytes on disk while the
writer goes on, so the fsync that commits it waits only for the tail.

Without it a shard's bytes stay dirty in the page cache until its commit (the kernel's own write-back
starts after 30 s, or at 10% of memory dirty), and every shard of a conversion, finishing together,
waits at the end for the whole run's bytes to reach the disk. `sync_file_range(SYNC_FILE_RANGE_WRITE)`
(Linux) starts that write-out for a range and returns; it changes no byte and promises no durability,
so the commit's fsync stays. Where libc has no such call (macOS, musl builds without it) this does
nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging

logger = logging.getLogger(__name__)

# How often a writer asks: large enough that the calls cost nothing (one per this many bytes), small
# enough that a shard's tail left for its fsync is a fraction of a shard.
WRITEBACK_BYTES = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start write-out of dirty pages not already under write-out


@functools.cache
def _sync_file_range():
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


def available() -> bool:
    """True where the kernel can be asked to start write-back early (Linux)."""
    return _sync_file_range() is not None


def start_writeback(fd: int, offset: int, count: int) -> bool:
    """Asks the kernel to start writing bytes [offset, offset + count) of `fd` to disk, without waiting
    for them; False where it cannot (no such call, or the file system refused), which only means the
    commit's fsync does all the work, as before."""
    call = _sync_file_range()
    if call is None or count <= 0:
        return False
    if call(fd, offset, count, _SYNC_FILE_RANGE_WRITE) != 0:
        logger.debug("sync_file_range refused (errno %d); the commit's fsync writes it all", ctypes.get_errno())
        return False
    return True
