"""`train --cold`: start a run with none of its data cached, where a cache across runs exists.

- Local files: evicted from the page cache (`posix_fadvise(DONTNEED)`), so the first epoch reads the disk.
- A mounted folder (NFS, the emulator's FUSE mount, gcsfuse): the kernel's cached pages of its files are
  dropped the same way, so every read goes to the mount's server again and pays its latency.
- gs:// and s3://: not applicable. TF's gs:// block cache and stallscope's readers keep what they read
  in the process only, so every run starts cold there already.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from stallscope.storage.location import is_remote
from stallscope.storage.page_cache import evict_from_page_cache

log = logging.getLogger(__name__)

NOT_APPLICABLE = ("not applicable to {scheme} data: its readers keep what they read in this process only, "
                  "so every run starts cold there already")


@dataclasses.dataclass(frozen=True)
class ColdStart:
    """What --cold did: `applied` (files evicted) or not, and in words why or how."""

    applied: bool
    files: int
    bytes: int
    how: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def start_cold(dataset_path: Any, files: Sequence[Any]) -> ColdStart:
    """Evicts the data's files from the page cache where that makes the run cold; says so where it cannot."""
    if is_remote(dataset_path):
        scheme = str(dataset_path).split("://", 1)[0] + "://"
        return ColdStart(False, 0, 0, NOT_APPLICABLE.format(scheme=scheme))
    result = evict_from_page_cache(files)
    how = (f"{result.files:,} file(s), {result.bytes / 1e6:,.1f} MB, evicted from the page cache "
           "(posix_fadvise DONTNEED) before the run")
    if result.failed:
        how += f"; {len(result.failed)} could not be, e.g. {result.failed[0]}"
    log.info("cold start: %s", how)
    return ColdStart(result.files > 0, result.files, result.bytes, how)
