"""Our framing and Example encoding are what TensorFlow writes and reads."""

from __future__ import annotations

import pytest

from stallscope.records.schema import SEED, STANDARD, encode_example
from stallscope.records.writer import ShardWriter, encode_example_bytes, frame_record, masked_crc32c


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
