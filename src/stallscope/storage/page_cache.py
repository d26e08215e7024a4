"""Evicting files from the page cache, so the next read goes to the storage below it: a cold run.

`posix_fadvise(DONTNEED)` needs no root. On a FUSE mount (the emulator's, gcsfuse) it drops the kernel's
cached pages of the mount's files, so every read goes to the mount's server again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvictionResult:
    files: int        # files asked to leave the page cache
    bytes: int        # their total size
    failed: tuple[str, ...] = ()  # "path: reason" for files that could not be opened


def evict_from_page_cache(paths: Iterable[str | os.PathLike]) -> EvictionResult:
    """Drops the files' pages from the page cache, so the next read comes from storage.

    Dirty pages are flushed first (fdatasync), since DONTNEED leaves unwritten pages in place.
    """
    count = size = 0
    failed = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror}")
            continue
        try:
            try:
                os.fdatasync(fd)
            except OSError:
                pass  # read-only file systems refuse fdatasync; nothing of ours is dirty there
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            size += os.fstat(fd).st_size
            count += 1
        finally:
            os.close(fd)
    if failed:
        logger.warning("could not evict %d file(s) from the page cache, e.g. %s", len(failed), failed[0])
    return EvictionResult(files=count, bytes=size, failed=tuple(failed))
