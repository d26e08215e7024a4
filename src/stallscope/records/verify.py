"""`verify_records(records_dir) -> VerifyReport`: re-read every shard and name any damage precisely.

TF's reader reports "corrupted record at 1234" without the file, and `ignore_errors()` silently
drops the rest of a shard. Here the TFRecord framing is parsed in Python, so each problem names the
shard, the record index and the byte offset: a bad length or data checksum, a truncated shard, a
missing or unknown shard, a count, size or sha256 that differs from `manifest.json`, a record that is
not an Example of the schema, a label outside [0, N), an image TensorFlow cannot decode.

Without a manifest (e.g. seed-style `out_0.tfrecord` files) it checks framing, parsing and images,
with the schema detected from the first record.

Memory stays bounded whatever the shard size: a shard is memory-mapped, not read into memory, and
its images are decoded in windows of `DECODE_WINDOW` records.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import logging
import mmap
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from stallscope.config import usable_cores
from stallscope.records.completeness import STATE_DIR, unfinished_conversion
from stallscope.errors import DataError, UsageError
from stallscope.records.manifest import MANIFEST_NAME, Manifest, load_manifest
from stallscope.records.schema import SCHEMAS, Schema, detect_schema
from stallscope.records.writer import FOOTER_BYTES, HEADER_BYTES
from stallscope.storage.location import RemotePath, StorageError, as_path
from stallscope.storage.mounts import NetworkGuard, Ticks
from stallscope.storage.tfrecord_frames import Frame
from stallscope.storage.tfrecord_frames import FrameError as BrokenFrame
from stallscope.storage.tfrecord_frames import read_frames as frames_of
from stallscope.tfprotos import EXAMPLE, tf_proto

log = logging.getLogger(__name__)

DECODE_WINDOW = 256  # images held at once while decoding a shard


@dataclasses.dataclass(frozen=True)
class Problem:
    file: str
    kind: str  # incomplete, missing shard, unknown shard, truncated, length checksum, data checksum, count, size, sha256, parse, label, image
    message: str
    record: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        where = self.file
        if self.record is not None:
            where += f": record {self.record}"
        if self.offset is not None:
            where += f" at byte {self.offset}"
        return f"{where}: {self.message}"


@dataclasses.dataclass(frozen=True)
class ShardCheck:
    file: str
    records: int
    bytes: int
    sha256: str
    images_decoded: int
    ok: bool


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    records_dir: Path
    schema: str | None
    has_manifest: bool
    shards: tuple[ShardCheck, ...]
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def images_decoded(self) -> int:
        return sum(s.images_decoded for s in self.shards)

    def summary_line(self) -> str:
        against = f"against {MANIFEST_NAME}" if self.has_manifest else f"(no {MANIFEST_NAME}: counts only)"
        facts = f"{len(self.shards)} shard(s), {self.records} records, {self.images_decoded} images decoded {against}"
        if self.ok:
            return f"OK: {facts}"
        bad_files = len({p.file for p in self.problems})
        return f"FAILED: {len(self.problems)} problem(s) in {bad_files} file(s); {facts}"


class FrameError(Exception):
    """The framing of a shard cannot be read past this point."""

    def __init__(self, kind: str, message: str, record: int, offset: int) -> None:
        super().__init__(message)
        self.kind, self.message, self.record, self.offset = kind, message, record, offset


def _reading(data) -> Callable[[int], bytes]:
    """`read(n)` over bytes or an mmap: the next n bytes, sliced out (no copy of the whole)."""
    at = [0]

    def read(size: int) -> bytes:
        piece = data[at[0]:at[0] + size]
        at[0] += len(piece)
        return piece

    return read


def read_frames(data: bytes) -> Iterator[Frame]:
    """Parses TFRecord framing (`tfrecord_frames.read_frames`). A bad data checksum is reported per frame
    and reading goes on (the length was sound); a bad length checksum or a short read raises FrameError:
    nothing after it can be trusted."""
    end = len(data)
    try:
        yield from frames_of(_reading(data))
    except BrokenFrame as exc:
        left = end - exc.offset
        if exc.kind == "truncated header":
            raise FrameError("truncated", f"shard ends inside a record header ({left} of {HEADER_BYTES} bytes)",
                             exc.record, exc.offset) from None
        if exc.kind == "length checksum":
            raise FrameError("length checksum", f"length field checksum mismatch; the remaining {left} bytes cannot be read",
                             exc.record, exc.offset) from None
        if exc.kind == "implausible length":
            raise FrameError("length checksum", f"implausible record length {exc.length}", exc.record, exc.offset) from None
        raise FrameError(
            "truncated", f"shard ends inside this record: it needs {exc.length + HEADER_BYTES + FOOTER_BYTES} bytes, "
            f"{left} remain", exc.record, exc.offset,
        ) from None


def _shard_files(records_dir: Path) -> list[str]:
    """Files that look like TFRecord shards: ours (`train-00000-of-00004.tfrecord`) and seed-style ones."""
    return sorted(
        e.name for e in records_dir.iterdir()
        if e.is_file() and not e.name.startswith(".") and "tfrecord" in e.name.lower()
    )


def _detect(payload: bytes) -> Schema | None:
    try:
        return detect_schema(payload)
    except Exception:  # not an Example at all, or neither schema's keys
        return None


_TF_NOISE = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[\[\{\{node [^}]*\}\}\]\]|\s*\[Op:\w+\]( name: \S*)?")


def tf_error_line(message: str) -> str:
    """TF's error message as one readable line: without `{{function_node ...}}` or `[Op:DecodeJpeg]`."""
    lines = [line for line in (_TF_NOISE.sub("", m).strip() for m in message.splitlines()) if line]
    return (lines[0] if lines else message.strip())[:200]


def _decoder(jpeg_only: bool) -> Callable[[bytes], str | None]:
    """A function returning None when TF decodes the image as RGB, else TF's error in one line."""
    import tensorflow as tf

    def decode(data: bytes) -> str | None:
        if jpeg_only and data[:3] != b"\xff\xd8\xff":
            return f"image is not a JPEG (starts with {data[:4].hex()})"
        try:
            if jpeg_only:
                tf.io.decode_jpeg(data, channels=3)
            else:
                tf.io.decode_image(data, channels=3, expand_animations=False)
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as exc:
            return tf_error_line(exc.message)
        return None

    return decode


def verify_records(records_dir: Path | str, *, decode: bool = True, threads: int | None = None) -> VerifyReport:
    """Checks every shard of a records directory; `decode=False` skips image decoding (and TF's import:
    Examples are parsed by TF's generated proto module alone)."""
    example = tf_proto(EXAMPLE, "verify").Example
    records_dir = as_path(records_dir)
    try:
        return _verify(records_dir, decode, threads, example)
    except StorageError as exc:
        raise StorageError(f"RECORDS_DIR: {exc}") from None


def _verify(records_dir, decode: bool, threads: int | None, example) -> VerifyReport:
    # On a network file system every step is bounded: a server that stops answering a listing or a
    # shard's page faults ends the check with one line instead of holding it (`storage/mounts.NetworkGuard`).
    guard = NetworkGuard.of(records_dir, flag="")
    listed = guard(lambda: _listed(records_dir), f"listing {str(records_dir)!r}")
    manifest, problems, expected, order, schema = listed
    num_labels = len(manifest.labels) if manifest is not None else None
    decode_one = _decoder(jpeg_only=manifest is not None) if decode else None
    checks: list[ShardCheck] = []
    with concurrent.futures.ThreadPoolExecutor(threads or usable_cores()) as pool:
        for name in order:
            path = records_dir / name
            read = Ticks()

            def check(path=path, name=name, schema=schema, read=read) -> tuple | None:
                if not path.is_file():
                    return None
                with _mapped(path) as data:
                    found = _check_shard(name, data, schema, num_labels, decode_one, pool, example, read)
                    return (*found, _sha256(data, read), len(data))

            checked = guard(check, f"reading {str(path)!r}", read, unit="records and megabytes read")
            if checked is None:
                problems.append(Problem(name, "missing shard", f"listed in {MANIFEST_NAME} but not found"))
                continue
            shard_problems, records, decoded, schema, sha, size = checked
            info = expected.get(name)
            if info is not None:
                if records != info.records and not any(p.kind in ("truncated", "length checksum") for p in shard_problems):
                    shard_problems.append(Problem(name, "count", f"{records} records, {MANIFEST_NAME} says {info.records}"))
                if size != info.bytes:
                    shard_problems.append(Problem(name, "size", f"{size} bytes, {MANIFEST_NAME} says {info.bytes}"))
                if sha != info.sha256:
                    shard_problems.append(Problem(name, "sha256", f"sha256 {sha[:12]}... differs from {MANIFEST_NAME}'s {info.sha256[:12]}..."))
            problems.extend(shard_problems)
            checks.append(ShardCheck(name, records, size, sha, decoded, not shard_problems))
    has_manifest = manifest is not None
    return VerifyReport(records_dir, schema.name if schema else None, has_manifest, tuple(checks), tuple(problems))


def _listed(records_dir) -> tuple:
    """What there is to check: (manifest or None, problems found so far, the manifest's shards by name,
    the order to check them in, the schema if known)."""
    if not records_dir.is_dir():
        if isinstance(records_dir, RemotePath) and not records_dir.exists():
            raise UsageError(f"RECORDS_DIR: {str(records_dir)!r} does not exist (nothing is stored under this prefix)")
        raise UsageError(f"RECORDS_DIR: {str(records_dir)!r} is not a directory")
    has_manifest = (records_dir / MANIFEST_NAME).exists()
    manifest: Manifest | None = load_manifest(records_dir) if has_manifest else None
    present = _shard_files(records_dir)
    problems: list[Problem] = []
    expected: dict[str, object] = {}
    if manifest is not None:
        schema: Schema | None = SCHEMAS.get(manifest.schema)
        if schema is None:
            raise DataError(f"{records_dir / MANIFEST_NAME}: unknown schema {manifest.schema!r}")
        expected = {s.file: s for split in manifest.splits.values() for s in split.shards}
        order = list(expected)
        for name in present:
            if name not in expected:
                problems.append(Problem(name, "unknown shard", f"not listed in {MANIFEST_NAME}"))
    else:
        unfinished = unfinished_conversion(records_dir)
        if unfinished:
            if not present:
                raise DataError(f"RECORDS_DIR: {str(records_dir)!r} holds {unfinished}")
            problems.append(Problem(STATE_DIR if (records_dir / STATE_DIR).is_dir() else present[0], "incomplete", unfinished))
        if not present:
            raise DataError(f"RECORDS_DIR: {str(records_dir)!r} has no {MANIFEST_NAME} and no *.tfrecord files")
        schema = None
        order = present
    return manifest, problems, expected, order, schema


def _sha256(data, read: Ticks) -> str:
    """The shard's sha256, a megabyte at a time: on a network file system each is a sign of progress."""
    sha = hashlib.sha256()
    view = memoryview(data)
    try:
        for start in range(0, len(view), 1 << 20):
            sha.update(view[start:start + (1 << 20)])
            read.count += 1
    finally:
        view.release()
    return sha.hexdigest()


@contextlib.contextmanager
def _mapped(path: Path):
    """The shard's bytes as a read-only memory map (an empty file as b""); a remote shard's, read whole."""
    if isinstance(path, RemotePath):
        yield path.read_bytes()
        return
    with open(path, "rb") as handle:
        if handle.seek(0, 2) == 0:
            yield b""
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield data


def _check_shard(name, data, schema, num_labels, decode_one, pool, example, read: Ticks | None = None):
    problems: list[Problem] = []
    images: list[tuple[int, int, bytes]] = []
    records = 0
    decoded = 0

    def decode_window():
        nonlocal decoded
        if decode_one is not None:
            for (index, offset, _), error in zip(images, pool.map(decode_one, [img for _, _, img in images])):
                if error:
                    problems.append(Problem(name, "image", f"TensorFlow cannot decode the image: {error}", index, offset))
                else:
                    decoded += 1
        images.clear()

    try:
        for frame in read_frames(data):
            records += 1
            if read is not None:
                read.count = records
            if not frame.data_crc_ok:
                problems.append(Problem(name, "data checksum", "record data checksum mismatch (damaged bytes)", frame.index, frame.offset))
                continue
            if schema is None:
                schema = _detect(frame.payload)
                if schema is None:
                    problems.append(Problem(name, "parse", "not a tf.train.Example with either schema's keys", frame.index, frame.offset))
                    continue
            problem, image = _check_example(name, frame, schema, num_labels, example)
            if problem:
                problems.append(problem)
            elif image is not None:
                images.append((frame.index, frame.offset, image))
                if len(images) >= DECODE_WINDOW:
                    decode_window()
    except FrameError as exc:
        problems.append(Problem(name, exc.kind, exc.message, exc.record, exc.offset))
    decode_window()
    problems.sort(key=lambda p: (p.record is None, p.record or 0))
    return problems, records, decoded, schema


def _check_example(name, frame: Frame, schema: Schema, num_labels, example):
    try:
        feature = example.FromString(frame.payload).features.feature
    except Exception as exc:
        return Problem(name, "parse", f"not a tf.train.Example ({exc.__class__.__name__})", frame.index, frame.offset), None
    missing = [k for k in (schema.image_key, schema.label_key) if k not in feature]
    if missing:
        return Problem(name, "parse", f"missing feature {missing[0]!r} of the {schema.name} schema", frame.index, frame.offset), None
    labels = feature[schema.label_key].int64_list.value
    images = feature[schema.image_key].bytes_list.value
    if len(labels) != 1 or len(images) != 1:
        return Problem(name, "parse", f"expected one label and one image, found {len(labels)} and {len(images)}", frame.index, frame.offset), None
    label = labels[0]
    if label < 0 or (num_labels is not None and label >= num_labels):
        bound = f"[0, {num_labels})" if num_labels is not None else ">= 0"
        return Problem(name, "label", f"label {label} outside {bound}", frame.index, frame.offset), None
    return None, images[0]
