"""How many records local TFRecord shards hold, without reading their payloads.

TF gives a `TFRecordDataset` no length, so a diagnosis of a records pipeline of your own cannot tell
where a pass over it ends. The count comes from a stallscope manifest beside the shards where it lists
each one at its present size, else from walking each shard's record headers: a 12-byte read and a seek
per record, each length checked against its checksum (ImageNet's 1.28 million records: a few seconds).
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

log = logging.getLogger(__name__)

COUNT_BUDGET_S = 5.0  # past this, a count is given up: the diagnosis goes on without a pass length
CACHED_COUNTS = 16    # shard sets whose counts are kept, each under its files' sizes and change times

_counted: dict[tuple, int | None] = {}


def count_records(paths: Sequence[str], *, budget_s: float = COUNT_BUDGET_S) -> int | None:
    """The records in the shards at `paths` (local, uncompressed); None where one is not a local file, a
    header is damaged or cut short (TF will say so when it reads it), or counting outlasts `budget_s`."""
    if not paths or any("://" in str(p) for p in paths):
        return None
    try:
        stamp = tuple((str(p), *_stat(p)) for p in paths) + tuple(
            (str(m), *_stat(m)) for m in sorted({Path(p).parent / MANIFEST_NAME for p in paths}) if m.exists())
    except OSError:
        return None
    if stamp in _counted:  # a diagnosis asks of the same shards for the pass and for the shuffle
        return _counted[stamp]
    total = _count(paths, budget_s)
    if len(_counted) >= CACHED_COUNTS:
        _counted.pop(next(iter(_counted)))
    _counted[stamp] = total
    return total


def _stat(path) -> tuple[int, int]:
    status = os.stat(path)
    return status.st_size, status.st_mtime_ns


def _count(paths: Sequence[str], budget_s: float) -> int | None:
    listed = _manifest_counts(paths)
    if listed is not None:
        return listed
    deadline = time.monotonic() + budget_s
    total = 0
    for path in paths:
        count = _walk_headers(Path(path), deadline)
        if count is None:
            return None
        total += count
    return total


def _manifest_counts(paths: Sequence[str]) -> int | None:
    """The sum of the shards' records as the manifests beside them list them, where every shard is listed
    at the size it has now; else None (then the headers are walked)."""
    listed: dict[Path, tuple[int, int]] = {}
    for folder in {Path(p).resolve().parent for p in paths}:
        try:
            data = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
            for split in data["splits"].values():
                for shard in split["shards"]:
                    listed[(folder / shard["file"]).resolve()] = (int(shard["records"]), int(shard["bytes"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
    total = 0
    for path in paths:
        resolved = Path(path).resolve()
        entry = listed.get(resolved)
        try:
            if entry is None or os.stat(resolved).st_size != entry[1]:
                return None
        except OSError:
            return None
        total += entry[0]
    return total


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
