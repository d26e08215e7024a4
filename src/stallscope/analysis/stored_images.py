"""The size of the images a run reads, from a few of them, so "store smaller images" is advised only
where it would shrink something: a 256x256 JPEG decoded for a 224 px model has little to lose.

Read from the run's summary.json (`source.kind`, `source.path`, `source.schema`): the headers of the
first image files, or the first records of the first shard. Only local paths; a few reads.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import struct
from pathlib import Path
from typing import Any

from stallscope.data.images import plain_jpeg_size

log = logging.getLogger(__name__)

SAMPLED = 8                  # images looked at
HEADER_BYTES = 256 * 1024    # enough for a JPEG's markers up to its frame header
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".JPG", ".JPEG")
SHRINK_FROM = 2.0            # advise smaller stored images from this ratio of stored side to model input


@dataclasses.dataclass(frozen=True)
class StoredImages:
    side: int        # the median longer side of the images looked at, in pixels
    sampled: int
    where: str       # the folder or shard they were read from


def stored_images(summary: dict[str, Any] | None) -> StoredImages | None:
    """The median longer side of a few of the run's stored JPEGs; None where unknown (no summary, a
    remote or missing path, no plain JPEG among the first few)."""
    source = (summary or {}).get("source") if isinstance(summary, dict) else None
    if not isinstance(source, dict) or not isinstance(source.get("path"), str) or "://" in source["path"]:
        return None
    path = Path(source["path"])
    try:
        if source.get("kind") == "files":
            blobs, where = _file_heads(path), str(path)
        elif source.get("kind") == "records":
            shard = next(iter(sorted(p for p in path.glob("*") if p.is_file() and ".tfrecord" in p.name)), None)
            if shard is None:
                return None
            blobs, where = _record_images(shard, str(source.get("schema") or "standard")), str(shard)
        else:
            return None
    except OSError as exc:
        log.debug("stored image sizes not read from %s: %s", path, exc)
        return None
    sides = [max(size) for size in map(plain_jpeg_size, blobs) if size]
    if not sides:
        return None
    return StoredImages(side=int(statistics.median(sides)), sampled=len(sides), where=where)


def _file_heads(folder: Path) -> list[bytes]:
    heads = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in IMAGE_SUFFIXES and path.is_file():
            with open(path, "rb") as handle:
                heads.append(handle.read(HEADER_BYTES))
            if len(heads) >= SAMPLED:
                break
    return heads


def _record_images(shard: Path, schema_name: str) -> list[bytes]:
    """The image bytes of a shard's first records (TFRecord framing read directly, Example parsed)."""
    from tensorflow.core.example import example_pb2

    from stallscope.records.schema import SCHEMAS

    schema = SCHEMAS.get(schema_name)
    if schema is None:
        return []
    images = []
    with open(shard, "rb") as handle:
        while len(images) < SAMPLED:
            head = handle.read(12)
            if len(head) < 12:
                break
            (length,) = struct.unpack("<Q", head[:8])
            data = handle.read(length)
            handle.read(4)
            if len(data) < length:
                break
            feature = example_pb2.Example.FromString(data).features.feature.get(schema.image_key)
            if feature is not None and feature.bytes_list.value:
                images.append(feature.bytes_list.value[0])
    return images


def shrink_worth(stored: StoredImages | None, image_size: int | None) -> bool | None:
    """Whether the stored images exceed the model's input by SHRINK_FROM or more; None where unknown."""
    if stored is None or not image_size:
        return None
    return stored.side >= SHRINK_FROM * image_size
