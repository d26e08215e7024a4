"""Counting the records of local TFRecord shards without reading their payloads."""

from __future__ import annotations

import json

import tensorflow as tf

from stallscope.records.convert import ConvertOptions, convert_tree
from stallscope.records.record_count import count_records


def _shard(path, records: int, size: int = 10, compression: str | None = None) -> str:
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for i in range(records):
            writer.write(bytes([i % 256]) * size)
    return str(path)


def test_the_headers_are_walked_where_no_manifest_lists_the_shards(tmp_path):
    shards = [_shard(tmp_path / "a.tfrecord", 7), _shard(tmp_path / "b.tfrecord", 0), _shard(tmp_path / "c", 5000, 1)]
    assert count_records(shards) == 5007
    assert count_records(shards[:1]) == 7


def test_a_stallscope_manifest_gives_the_counts_while_the_shards_are_as_it_lists_them(tiny_tree, tmp_path):
    out = tmp_path / "records"
    convert_tree(ConvertOptions(tiny_tree, out, shards=3, workers=1))
    shards = sorted(str(p) for p in out.glob("*.tfrecord"))
    assert count_records(shards) == 24
    # the manifest says more than the shards hold: a shard of the listed size is believed, so it must be
    # the manifest that answers (a walk of the headers would give 24)
    manifest = json.loads((out / "manifest.json").read_text())
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            shard["records"] += 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert count_records(shards) == 27
    # a shard no longer the size listed: the headers are walked
    with open(shards[0], "ab") as handle:
        handle.write(open(_shard(tmp_path / "extra", 2), "rb").read())
    assert count_records(shards) == 26


def test_what_cannot_be_counted_is_none(tmp_path):
    sound = _shard(tmp_path / "sound", 3)
    cut = tmp_path / "cut"
    cut.write_bytes(open(sound, "rb").read()[:-3])
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not a tfrecord shard at all")
    assert count_records([sound, str(cut)]) is None
    assert count_records([str(garbage)]) is None
    assert count_records([_shard(tmp_path / "gz", 3, compression="GZIP")]) is None
    assert count_records([sound, str(tmp_path / "missing")]) is None
    assert count_records([]) is None
    assert count_records(["hdfs://namenode/data/shard-0"]) is None  # a scheme stallscope does not read
    assert count_records([_shard(tmp_path / "many", 5000, 1)], budget_s=0.0) is None  # over its time
