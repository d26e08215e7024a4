"""TFRecord framing and tf.train.Example encoding in plain Python, and a crash-safe shard writer.

Conversion workers build records without importing TensorFlow (seconds of start-up and hundreds of
MB per process saved): an Example is a small protobuf we encode by hand, and a TFRecord frame is
`uint64 length | masked crc32c(length) | data | masked crc32c(data)`. Tests check both against
TensorFlow's own reader and parser.
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from stallscope.errors import UsageError
from stallscope.records import sharding
from stallscope.records.manifest import LABELS_NAME, MANIFEST_NAME, ShardInfo
from stallscope.records.schema import Schema
from stallscope.records.writeback import WRITEBACK_BYTES, start_writeback
from stallscope.storage.tfrecord_frames import (  # noqa: F401 (the frame: its home, imported from here too)
    CRC, FOOTER_BYTES, HEADER_BYTES, LENGTH, _mask, crc32c, crc32c_extend, masked_crc32c,
)

def frame_record(payload: bytes) -> bytes:
    """One TFRecord frame around `payload`."""
    length = LENGTH.pack(len(payload))
    return b"".join((length, CRC.pack(masked_crc32c(length)), payload, CRC.pack(masked_crc32c(payload))))


def _varint_slow(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # negative int64 values take ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_SMALL_VARINTS = tuple(_varint_slow(v) for v in range(1 << 14))  # tags, keys, labels, most lengths


def _varint(value: int) -> bytes:
    """Protobuf's varint; the values below 2**14 that make up most of an Example come from a table
    (a record needs about 75 of them: a measurable share of a worker's time when computed), and an
    image's lengths (five per record, below 2**21 up to 2 MB) take the three-byte form directly."""
    if 0 <= value < 16384:
        return _SMALL_VARINTS[value]
    if 16384 <= value < 2097152:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    return _varint_slow(value)


def _header(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(length)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _header(number, len(payload)) + payload


@functools.cache
def _layout(schema: Schema) -> tuple[tuple[bytes, bool, int], ...]:
    """A schema's features in serialization (sorted key) order: (key field, is bytes, argument index).
    Computed once per schema and process, so a record's encoding is a flat loop."""
    sources = {schema.image_key: (True, 0), schema.label_key: (False, 1), schema.filename_key: (True, 2)}
    extras = {"image/format": (True, 3), "image/class/text": (True, 4), "image/height": (False, 5), "image/width": (False, 6)}
    for key, _ in schema.extra_keys:
        sources[key] = extras[key]
    return tuple((_field(1, key.encode("utf-8")), *sources[key]) for key in sorted(sources))


@functools.lru_cache(maxsize=4096)
def _bytes_head(key_field: bytes, size: int) -> bytes:
    """A bytes feature's map entry up to its value. It depends only on the key and the value's length,
    so the heads of file names, formats and class names repeat and come from this cache."""
    inner = _varint(size)  # BytesList.value's length
    inner_length = 1 + len(inner) + size
    outer = _varint(inner_length)  # Feature.bytes_list's length
    feature_length = 1 + len(outer) + inner_length
    value_header = b"\x12" + _varint(feature_length)  # the map entry's value
    entry_length = len(key_field) + len(value_header) + feature_length
    return b"".join((b"\x0a", _varint(entry_length), key_field, value_header, b"\x0a", outer, b"\x0a", inner))


@functools.lru_cache(maxsize=4096)
def _int64_entry(key_field: bytes, value: int) -> bytes:
    """An int64 feature's whole map entry; labels, heights and widths repeat, so it comes from this cache."""
    number = _varint(value)
    packed = b"\x0a" + _varint(len(number)) + number  # packed Int64List.value
    feature = b"\x1a" + _varint(len(packed)) + packed  # Feature.int64_list
    value_field = b"\x12" + _varint(len(feature)) + feature
    return b"".join((b"\x0a", _varint(len(key_field) + len(value_field)), key_field, value_field))


def _example_parts(schema: Schema, values: tuple) -> tuple[list[bytes], int]:
    """The Example's bytes in order as small protobuf pieces and each bytes value as it is (never copied),
    and where the image is among them. The lengths are added up as the pieces are made, in a flat loop
    over the schema's precomputed layout (the general-purpose version took 30 us a record)."""
    parts: list[bytes] = [b"\x0a", b""]  # Example.features, its length filled in below
    append = parts.append
    total = 0
    image_at = 0
    for key_field, is_bytes, index in _layout(schema):
        value = values[index]
        if is_bytes:
            head = _bytes_head(key_field, len(value))
            append(head)
            if index == 0:
                image_at = len(parts)
            append(value)
            total += len(head) + len(value)
        else:
            entry = _int64_entry(key_field, int(value))
            append(entry)
            total += len(entry)
    parts[1] = _varint(total)  # Example.features -> Features.feature map entries
    return parts, image_at


def encode_example_bytes(schema: Schema, **fields) -> bytes:
    """The same Example as `schema.encode_example`, serialized without TensorFlow (keys in sorted order),
    from the fields `encode_example_parts` takes. Built from parts with their lengths added up and
    joined once, so the image bytes are copied once rather than once per nesting level (five levels:
    a measurable share of a conversion's CPU)."""
    return b"".join(encode_example_parts(schema, **fields))


def encode_example_parts(
    schema: Schema,
    *,
    image: bytes,
    label: int,
    filename: bytes,
    label_text: bytes = b"",
    height: int = 0,
    width: int = 0,
    image_format: bytes = b"jpeg",
) -> tuple[bytes, bytes, bytes]:
    """`encode_example_bytes` as (the bytes before the image, the image object itself, the bytes after),
    for `RecordFile.write_parts`: the image is framed, hashed and written without first being copied
    into a payload (with the cached heads, 3-5 us less CPU per 78 KB image than the joined payload)."""
    parts, at = _example_parts(schema, (image, label, filename, image_format, label_text, height, width))
    return b"".join(parts[:at]), image, b"".join(parts[at + 1:])


def temporary_name(final: Path) -> Path:
    """Where a shard is written before it is complete; hidden, so readers never glob it."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def is_temporary(name: str) -> bool:
    return name.startswith(".") and ".tmp-" in name


_PART_SUFFIX = re.compile(r"\.part-\d{5}$")


def is_convert_temporary(name: str) -> bool:
    """`.train-00000-of-00002.tfrecord.tmp-123` (or `....tfrecord.part-00003.tmp-123`, a worker's segment,
    or `.manifest.json.tmp-123`): a shard, manifest or labels file `convert` did not finish. Only such
    names are ever removed as a dead run's leftovers, in a folder or in a bucket."""
    if not is_temporary(name) or not name[name.rindex(".tmp-") + 5:].isdigit():
        return False
    base = _PART_SUFFIX.sub("", name[1:].split(".tmp-")[0])
    return base in (MANIFEST_NAME, LABELS_NAME) or bool(sharding.SHARD_NAME.match(base))


class RecordFile:
    """Framed records appended to one file, counted and (unless `hashed=False`) hashed as they are
    written: the bytes are hashed from memory once, never read back. A frame's parts (an Example's
    image among them) are checksummed, hashed and written as they are, never joined into one copy
    of the record: the file's buffer holds the only copy."""

    def __init__(self, path: Path | str, *, hashed: bool = True, early_writeback: bool = False) -> None:
        self.file = Path(path)
        self._handle = open(self.file, "wb", buffering=1 << 20)
        self._sha = hashlib.sha256() if hashed else None
        self.records = 0
        self.bytes = 0
        # Bytes handed to the kernel's write-back so far; None: left to the commit's fsync (a file that
        # is read back and deleted, such as a segment, is never asked to reach the disk).
        self._written_back = 0 if early_writeback else None

    def write(self, payload: bytes) -> None:
        self.write_parts((payload,))

    def write_parts(self, parts: Sequence[bytes]) -> None:
        """Appends one record whose payload is `parts` joined (`encode_example_parts`), without joining
        them: the checksum is extended part by part."""
        size = 0
        crc = 0
        for part in parts:
            size += len(part)
            crc = crc32c_extend(crc, part)
        length = LENGTH.pack(size)
        self._append((length + CRC.pack(masked_crc32c(length)), *parts, CRC.pack(_mask(crc))),
                     HEADER_BYTES + size + FOOTER_BYTES)

    def write_framed(self, frame: bytes) -> None:
        """Appends one already framed record (`frame_record(payload)`)."""
        self._append((frame,), len(frame))

    def _append(self, parts: tuple[bytes, ...], size: int) -> None:
        write = self._handle.write
        for part in parts:
            write(part)
        if self._sha is not None:
            update = self._sha.update
            for part in parts:
                update(part)
        self.records += 1
        self.bytes += size
        self._write_back()

    def _write_back(self) -> None:
        """Every WRITEBACK_BYTES, the bytes written since the last time go to the kernel's write-back
        (`writeback`): the commit's fsync then waits for a tail, not for the whole file."""
        if self._written_back is None or self.bytes - self._written_back < WRITEBACK_BYTES:
            return
        self._handle.flush()
        start_writeback(self._handle.fileno(), self._written_back, self.bytes - self._written_back)
        self._written_back = self.bytes

    def append_file(self, path: Path | str, records: int) -> None:
        """Appends the framed records another RecordFile wrote (`records` of them), hashing them from a
        memory map of that file: one pass over its bytes, no copy of them in Python."""
        with open(path, "rb") as source:
            size = source.seek(0, os.SEEK_END)
            if size:
                with mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    self._handle.write(data)
                    if self._sha is not None:
                        self._sha.update(data)
        self.records += records
        self.bytes += size
        self._write_back()

    def close(self, *, sync: bool = False) -> None:
        self._handle.flush()
        if sync:
            os.fsync(self._handle.fileno())
        self._handle.close()

    def abort(self) -> None:
        """Removes the unfinished file. Closing flushes the buffer, which fails again where the write
        failed (a full disk): that error is the caller's already, and the file goes all the same."""
        if not self._handle.closed:
            try:
                self._handle.close()
            except OSError:
                pass
        self.file.unlink(missing_ok=True)


class ShardWriter(RecordFile):
    """Writes framed records to a temporary file; `commit()` fsyncs and renames it into place.

    Used as a context manager: leaving the block without `commit()` (an error, a kill) leaves no
    visible shard, only a temporary the next run deletes.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        super().__init__(temporary_name(self.path), early_writeback=True)
        self._info: ShardInfo | None = None

    def commit(self, before_rename: Callable[[ShardInfo], None] | None = None) -> ShardInfo:
        """Makes the shard visible. `before_rename(info)` runs once the bytes are on disk but before the
        rename, so whatever it records (a resume state) exists whenever the shard does."""
        self.close(sync=True)
        info = ShardInfo(file=self.path.name, records=self.records, bytes=self.bytes, sha256=self._sha.hexdigest())
        if before_rename is not None:
            before_rename(info)
        os.replace(self.file, self.path)
        self._info = info
        return info

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._info is None:
            self.abort()


def file_sha256(path: Path | str, megabytes=None) -> str:
    """The file's sha256, read a megabyte at a time; `megabytes` (an `mounts.Ticks`), where given,
    counts them: a watcher's sign that the read is moving."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
            if megabytes is not None:
                megabytes.count += 1
    return sha.hexdigest()


class OutputFull(UsageError):
    """The output folder's file system (or the user's quota there) has no room for the shards."""

    def __init__(self, folder: Path, exc: OSError, flag: str = "--output_path") -> None:
        self.folder, self.reason = folder, exc.strerror or os.strerror(exc.errno)
        try:
            free = f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free there now"
        except OSError:
            free = "its free space unknown"
        super().__init__(
            f"{flag}: {str(folder)!r} is full ({self.reason}; {free}); expected a folder with room for the "
            f"shards: free space there or choose another {flag}, and run the same command again (the shards "
            "completed so far are kept; the unfinished files were removed)")
