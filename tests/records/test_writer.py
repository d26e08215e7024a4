"""Our framing and Example encoding are what TensorFlow writes and reads."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import time
from pathlib import Path

import pytest

from stallscope.records import writeback
from stallscope.records.schema import SEED, STANDARD, encode_example
from stallscope.records.writer import (
    RecordFile, ShardWriter, crc32c_extend, encode_example_bytes, encode_example_parts, frame_record, masked_crc32c,
)


def test_masked_crc32c_known_value():
    # crc32c("123456789") = 0xE3069283 (the standard check value), then TFRecord's mask
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_frames_match_tensorflows_writer_and_reader(tmp_path):
    import tensorflow as tf

    payloads = [b"", b"x", b"hello" * 1000, bytes(range(256))]
    theirs = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for payload in payloads:
            writer.write(payload)
    assert b"".join(frame_record(p) for p in payloads) == theirs.read_bytes()
    ours = tmp_path / "ours.tfrecord"
    with ShardWriter(ours) as writer:
        for payload in payloads:
            writer.write(payload)
        info = writer.commit()
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(ours))] == payloads
    assert (info.records, info.bytes, info.file) == (4, ours.stat().st_size, "ours.tfrecord")


@pytest.mark.parametrize("schema", [STANDARD, SEED], ids=lambda s: s.name)
@pytest.mark.parametrize("label", [0, 7, 2**40, -1])
@pytest.mark.parametrize("image_bytes", [16, 200, 20_000, 3_000_000])  # 1-, 2-, 3- and 4-byte lengths
def test_example_encoding_equals_tensorflows(schema, label, image_bytes):
    import tensorflow as tf

    image = (b"\xff\xd8\xff jpeg bytes" * (image_bytes // 16 + 1))[:image_bytes]
    fields = dict(image=image, label=label, filename="dir/ä \xff.jpg".encode("utf-8", "surrogateescape"),
                  label_text=b"n01440764", height=375, width=500)
    ours = tf.train.Example.FromString(encode_example_bytes(schema, **fields))
    theirs = tf.train.Example.FromString(encode_example(schema, **fields))
    assert ours == theirs


def test_shard_is_invisible_until_commit(tmp_path):
    path = tmp_path / "train-00000-of-00001.tfrecord"
    with pytest.raises(RuntimeError):
        with ShardWriter(path) as writer:
            writer.write(b"record")
            assert not path.exists() and len(list(tmp_path.iterdir())) == 1  # only the hidden temporary
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
    seen = []
    with ShardWriter(path) as writer:
        writer.write(b"record")
        writer.commit(before_rename=lambda info: seen.append((path.exists(), info.records)))
    assert seen == [(False, 1)] and path.exists()


def _examples():
    """Both schemas; an empty image, one- to four-byte lengths, one past 64 KB; negative and 40-bit labels."""
    for schema in (STANDARD, SEED):
        for size, label in ((0, 0), (1, 7), (200, -1), (70_000, 2**40), (3_000_000, 999)):
            image = bytes((i * 7 + size) & 0xFF for i in range(size)) if size < 100_000 else b"\xff\xd8" * (size // 2)
            yield schema, dict(image=image, label=label, filename=f"train/c/{size}.jpg".encode(),
                               label_text=b"n01440764"[: size % 10], height=size % 5000, width=500)


# sha256 of `_examples()` framed one by one (`frame_record(encode_example_bytes(...))`), computed before
# records were written in parts: the single-buffer path's bytes, which the parts path must keep.
SINGLE_BUFFER_SHA256 = "7232a821f15bde5cf0f4765ebd83d436c8bd5d0581dd179c843d18d778df56b1"


def test_examples_written_in_parts_are_the_single_buffer_bytes(tmp_path):
    import tensorflow as tf

    single = b"".join(frame_record(encode_example_bytes(schema, **fields)) for schema, fields in _examples())
    assert hashlib.sha256(single).hexdigest() == SINGLE_BUFFER_SHA256
    path = tmp_path / "train-00000-of-00001.tfrecord"
    with ShardWriter(path) as writer:
        for schema, fields in _examples():
            parts = encode_example_parts(schema, **fields)
            assert parts[1] is fields["image"]  # the image object itself, never a copy
            writer.write_parts(parts)
        info = writer.commit()
    assert path.read_bytes() == single
    assert (info.records, info.bytes, info.sha256) == (10, len(single), SINGLE_BUFFER_SHA256)
    payloads = [encode_example_bytes(schema, **fields) for schema, fields in _examples()]
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == payloads


def test_a_record_written_in_any_parts_is_its_frame(tmp_path):
    payload = bytes(range(256)) * 40
    record = RecordFile(tmp_path / "parts")
    record.write_parts((b"", payload[:1], payload[1:5000], b"", payload[5000:]))
    record.write_parts(())
    record.write(payload)
    record.close()
    assert (tmp_path / "parts").read_bytes() == frame_record(payload) + frame_record(b"") + frame_record(payload)
    assert (record.records, record.bytes) == (3, 2 * len(frame_record(payload)) + len(frame_record(b"")))


def test_crc32c_extends_part_by_part():
    """google-crc32c (a required dependency; no pure-Python fallback) extends part by part."""
    extend = crc32c_extend
    assert extend(extend(extend(0, b"1234"), b""), b"56789") == extend(0, b"123456789") == 0xE3069283


class _CacheStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def _dirty_pages(fd: int, length: int) -> int:
    """Dirty page-cache pages among a file's first `length` bytes, by the kernel's own count
    (cachestat(2), Linux 6.5+); skips the test where there is no such call."""
    libc = ctypes.CDLL(None, use_errno=True)
    span = (ctypes.c_uint64 * 2)(0, length)
    status = _CacheStat()
    if libc.syscall(_CACHESTAT, fd, ctypes.byref(span), ctypes.byref(status), 0) != 0:
        pytest.skip(f"cachestat(2) is not available here (errno {ctypes.get_errno()}); needs Linux 6.5+ on x86_64")
    return status.dirty


_CACHESTAT = 451  # x86_64 and most 64-bit architectures


def test_a_shard_goes_to_disk_while_it_is_written_and_a_segment_does_not(tmp_path):
    """A shard's bytes are handed to the kernel's write-back every WRITEBACK_BYTES, so its commit's
    fsync waits for a tail, not the whole shard; a segment (read back and deleted) never is."""
    if platform.machine() != "x86_64" or not writeback.available():
        pytest.skip(f"early write-back and cachestat(2) are Linux on x86_64 here; this is {platform.system()} {platform.machine()}")
    if _on_tmpfs(tmp_path):
        pytest.skip(f"{tmp_path} is on tmpfs, which has no write-back")
    record = b"\x5a" * 100_000
    first_block = writeback.WRITEBACK_BYTES
    shard = ShardWriter(tmp_path / "train-00000-of-00001.tfrecord")
    segment = RecordFile(tmp_path / ".part", hashed=False)
    for _ in range(first_block // len(record) + 20):
        shard.write(record)
        segment.write(record)
    deadline = time.monotonic() + 10
    while _dirty_pages(shard._handle.fileno(), first_block) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dirty_pages(shard._handle.fileno(), first_block) == 0
    assert _dirty_pages(segment._handle.fileno(), first_block) > 0  # left to the page cache, as before
    info = shard.commit()
    segment.close()
    assert (tmp_path / info.file).read_bytes() == frame_record(record) * info.records


def _on_tmpfs(path: Path) -> bool:
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    best = max((m for m in mounts if str(path.resolve()).startswith(m[1])), key=lambda m: len(m[1]))
    return best[2] == "tmpfs"
