"""How many records TFRecord shards hold, without reading their payloads.

TF gives a `TFRecordDataset` no length, so a diagnosis of a records pipeline of your own cannot tell
where a pass over it ends. The count comes from a stallscope manifest beside the shards where it lists
each one at its present size (local, gs:// or s3://: one small read and the listing the run holds),
else, for local shards, from walking each shard's record headers: a 12-byte read and a seek per record,
each length checked against its checksum (ImageNet's 1.28 million records: a few seconds). Shards in a
store without a manifest are not counted: a walk would be a request per record.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from stallscope.records.manifest import MANIFEST_NAME
from stallscope.records.writer import CRC, FOOTER_BYTES, HEADER_BYTES, LENGTH, masked_crc32c
from stallscope.errors import UsageError
from stallscope.storage.location import StorageError, as_path, is_remote

log = logging.getLogger(__name__)

COUNT_BUDGET_S = 5.0  # past this, a count is given up: the diagnosis goes on without a pass length
CACHED_COUNTS = 16    # shard sets whose counts are kept, each under its files' sizes and change times

_counted: dict[tuple, int | None] = {}


def count_records(paths: Sequence[str], *, budget_s: float = COUNT_BUDGET_S) -> int | None:
    """The records in the uncompressed shards at `paths`; None where one cannot be read, a header is
    damaged or cut short (TF will say so when it reads it), counting outlasts `budget_s`, or the shards
    are in a store and no manifest beside them lists them as they are."""
    if not paths:
        return None
    try:
        shards = [as_path(str(p)) for p in paths]  # a scheme stallscope does not read (hdfs://): UsageError
        manifests = sorted({shard.parent / MANIFEST_NAME for shard in shards}, key=str)
        stamp = tuple((str(p), *_stat(p)) for p in shards) + tuple((str(m), *_stat(m)) for m in manifests if m.exists())
    except (OSError, UsageError):  # StorageError is a UsageError: a store that refuses or does not answer
        return None
    if stamp in _counted:  # a diagnosis asks of the same shards for the pass and for the shuffle
        return _counted[stamp]
    total = _count(shards, budget_s)
    if len(_counted) >= CACHED_COUNTS:
        _counted.pop(next(iter(_counted)))
    _counted[stamp] = total
    return total


def _stat(path) -> tuple[int, int]:
    status = path.stat()
    return status.st_size, status.st_mtime_ns


def _count(shards: list, budget_s: float) -> int | None:
    listed = _manifest_counts(shards)
    if listed is not None or any(is_remote(str(shard)) for shard in shards):
        return listed
    deadline = time.monotonic() + budget_s
    total = 0
    for shard in shards:
        count = _walk_headers(shard, deadline)
        if count is None:
            return None
        total += count
    return total


def _manifest_counts(shards: list) -> int | None:
    """The sum of the shards' records as the manifests beside them list them, where every shard is listed
    at the size it has now; else None."""
    listed: dict[str, tuple[int, int]] = {}
    try:
        for folder in {shard.resolve().parent for shard in shards}:
            data = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
            for split in data["splits"].values():
                for entry in split["shards"]:
                    listed[str((folder / entry["file"]).resolve())] = (int(entry["records"]), int(entry["bytes"]))
        total = 0
        for shard in shards:
            entry = listed.get(str(shard.resolve()))
            if entry is None or shard.stat().st_size != entry[1]:
                return None
            total += entry[0]
        return total
    except (OSError, StorageError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.debug("no manifest counts for %s: %s", shards[0].parent, exc)
        return None


def _walk_headers(path: Path, deadline: float) -> int | None:
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            count = offset = 0
            while offset < size:
                header = handle.read(HEADER_BYTES)
                if len(header) < HEADER_BYTES or masked_crc32c(header[:8]) != CRC.unpack_from(header, 8)[0]:
                    log.debug("%s: no sound record header at byte %d", path, offset)
                    return None
                (length,) = LENGTH.unpack_from(header)
                offset += HEADER_BYTES + length + FOOTER_BYTES
                if offset > size:
                    return None
                handle.seek(offset)
                count += 1
                if count % 4096 == 0 and time.monotonic() > deadline:
                    log.debug("counting the records of %s took too long", path)
                    return None
            return count
    except OSError as exc:
        log.debug("cannot count the records of %s: %s", path, exc)
        return None
