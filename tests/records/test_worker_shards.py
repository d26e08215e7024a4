"""Workers write the shards themselves (whole shards, or segments joined in order): the bytes are those
of the one-writer path, every bad file is still reported with its reason, and no image bytes are planned."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from stallscope.errors import UsageError
from stallscope.records import convert
from stallscope.records.convert import ConvertOptions, convert_tree, segments_per_shard
from stallscope.records.manifest import load_manifest
from stallscope.records.schema import get_schema


def _plan(options: ConvertOptions):
    return convert.plan_conversion(options).shards


def _one_writer_bytes(options: ConvertOptions) -> dict[str, bytes]:
    """The previous path: every image's frame from `process_chunk`, concatenated in plan order by one writer."""
    shards = {}
    for shard in _plan(options):
        items = [(convert.source_path(options.dataset_path, c.name), c.name, c.label, os.fsencode(c.label_text)) for c in shard.items]
        results = convert.process_chunk(options.schema, options.image_options, items)
        shards[shard.filename] = b"".join(r[1] for r in results if r[0] == "ok")
    return shards


def _comparable(out: Path) -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["options"]["output_path"], manifest["options"]["workers"]
    return manifest


def test_whole_shards_and_joined_segments_hold_the_one_writer_bytes(messy_tree, jpeg_factory, tmp_path):
    root = messy_tree["root"]
    for i in range(200):  # enough images that shards are cut into segments of MIN_SEGMENT_IMAGES or more
        (root / "train" / ("cat", "dog")[i % 2] / f"extra_{i:03d}.jpg").write_bytes(jpeg_factory((24, 16)))
    for shards, workers in ((None, 1), (None, 3), (2, 2), (3, 3)):
        options = ConvertOptions(root, tmp_path / f"out-{shards}-{workers}", shards=shards, workers=workers, max_side=200, seed=3)
        plan = _plan(options)
        cuts = segments_per_shard(plan, options.resolved_workers)
        if workers > 1:
            assert max(cuts) > 1, "these runs are meant to split shards into segments"
        convert_tree(options)
        expected = _one_writer_bytes(options)
        assert sorted(p.name for p in options.output_path.glob("*.tfrecord")) == sorted(expected)
        for name, data in expected.items():
            assert (options.output_path / name).read_bytes() == data, (shards, workers, name)
        info = {s.file: s for split in load_manifest(options.output_path).splits.values() for s in split.shards}
        assert all(info[name].bytes == len(data) for name, data in expected.items())
    assert not list(tmp_path.glob("out-*/.*")), "segments or temporaries left behind"
    reference = _comparable(tmp_path / "out-None-1")
    assert _comparable(tmp_path / "out-None-3") == reference  # the manifest does not depend on the workers either


def test_bad_files_are_reported_with_their_reasons_when_workers_write(messy_tree, tmp_path):
    root, expect = messy_tree["root"], messy_tree["expect"]
    out = tmp_path / "out"
    convert_tree(ConvertOptions(root, out, workers=3, max_side=200))  # one shard per split, cut into segments
    manifest = load_manifest(out)
    skipped = {bytes.fromhex(e["path_hex"]) if "path_hex" in e else e["path"].encode(): e for e in manifest.skipped}
    for name, outcome in expect.items():
        if outcome not in ("ok", "repaired"):
            assert skipped[name]["reason"] == outcome, name
    assert skipped[b"train/dog/truncated.jpg"]["detail"]  # why, not only that
    assert "0x" not in skipped[b"train/dog/odd_\xff.jpg"].get("detail", "")  # no memory address in the manifest
    repaired = {e["path"]: e for e in manifest.repaired}
    assert set(repaired) == {k.decode() for k, v in expect.items() if v == "repaired"}
    assert all(e["shard"] == "train-00000-of-00001.tfrecord" for e in repaired.values())


def test_segments_only_where_shards_are_too_few_to_keep_workers_busy():
    def shard(n):
        return convert.PlannedShard("train", "x", tuple(range(n)), "")

    assert segments_per_shard([shard(1000)] * 12, 3) == [1] * 12  # 12 tasks for 3 workers: whole shards
    assert segments_per_shard([shard(1000)], 3) == [12]
    assert segments_per_shard([shard(1000)] * 2, 3) == [6, 6]
    assert segments_per_shard([shard(40), shard(5)], 3) == [1, 1]  # never below MIN_SEGMENT_IMAGES per segment
    assert segments_per_shard([shard(1000)], 1) == [1]  # one worker: whole shards in this process
    # output on a network file system: a task a worker, so fewer segments to read back across it
    assert segments_per_shard([shard(1000)] * 3, 3, tasks_per_worker=1) == [1, 1, 1]
    assert segments_per_shard([shard(1000)], 3, tasks_per_worker=1) == [3]



def test_output_on_a_network_file_system_cuts_shards_only_to_keep_every_worker_busy(tmp_path):
    def shard(n):
        items = tuple(convert.Candidate(f"cat/{i}.jpg".encode(), "train", 0, "cat", 1, 0) for i in range(n))
        return convert.PlannedShard("train", "train-0.tfrecord", items, "")

    def parts(output_fs):
        tasks = convert._segment_tasks(ConvertOptions(tmp_path, tmp_path / "out"), [shard(1000)] * 3, tmp_path, 3, output_fs)
        return [task.parts for task in tasks]

    assert parts(None) == [4] * 12  # local disk: 4 tasks a worker, for an even tail
    assert parts("nfs4") == [1, 1, 1]  # across the network a segment would be read back and written again


def test_the_plan_and_the_tasks_hold_paths_not_image_bytes(image_tree_factory, tmp_path):
    """Memory stays flat in the images' bytes: what is planned and sent to workers is file names."""
    root = image_tree_factory(classes=2, per_class=16)
    options = ConvertOptions(root, tmp_path / "out", shards=2, workers=3)
    plan = _plan(options)
    image_bytes = sum(p.stat().st_size for p in root.rglob("*.jpg"))
    for shard in plan:
        for item in shard.items:
            assert not any(isinstance(getattr(item, f), (bytes, bytearray)) and len(getattr(item, f)) > 4096
                           for f in item.__slots__)
    tasks = list(convert._segment_tasks(options, plan, tmp_path / "state", options.resolved_workers))
    assert sum(len(t.items) for t in tasks) == 32
    sent = sum(len(pickle.dumps(t)) for t in tasks)
    assert sent < image_bytes / 10, (sent, image_bytes)
    names = {os.fsencode(p.relative_to(root)) for p in root.rglob("*.jpg")}
    assert {item[1] for t in tasks for item in t.items} == names


def test_a_segment_left_by_a_killed_run_is_ours_to_delete(tiny_tree, tmp_path):
    out = tmp_path / "out"
    convert_tree(ConvertOptions(tiny_tree, out, shards=1, workers=1))
    leftover = out / ".train-00000-of-00001.tfrecord.part-00002.tmp-4242"
    leftover.write_bytes(b"half a segment")
    convert_tree(ConvertOptions(tiny_tree, out, shards=1, workers=2))
    assert not leftover.exists()
    foreign = out / ".notes.part-00002.tmp-1"  # named like ours only in part: not ours
    foreign.write_bytes(b"keep")
    with pytest.raises(UsageError, match=r"\.notes\.part-00002\.tmp-1"):
        convert_tree(ConvertOptions(tiny_tree, out, shards=1, workers=2))
    assert foreign.read_bytes() == b"keep"


def test_encoding_is_what_tensorflow_parses_at_varint_edges():
    """The flat-loop encoder against TF's own protos, for both schemas and lengths and values on either
    side of the varint table's edges (1, 2 and 3 byte varints)."""
    import tensorflow as tf

    from stallscope.records.schema import encode_example
    from stallscope.records.writer import encode_example_bytes

    for name in ("standard", "seed"):
        schema = get_schema(name)
        for label, size in ((0, 0), (127, 1), (128, 127), (16383, 128), (16384, 16384), (2**40, 70000)):
            kwargs = dict(image=bytes(size), label=label, filename=b"a/\xff" * (size % 50), label_text=b"t" * (size % 200),
                          height=label, width=size)
            ours = tf.train.Example.FromString(encode_example_bytes(schema, **kwargs))
            assert ours == tf.train.Example.FromString(encode_example(schema, **kwargs)), (name, label, size)


def _blas_threads_after_numpy() -> int:
    """In a worker: the BLAS pool's threads once numpy is in, as the stream check brings it in."""
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_info

    return max((pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"), default=1)


def test_a_workers_blas_pool_is_one_thread():
    """numpy comes into every worker with simplejpeg; OpenBLAS would start a busy-waiting thread per
    core there, for BLAS calls a conversion never makes."""
    with convert._worker_pool(2) as pool:
        assert [future.result(timeout=120) for future in [pool.submit(_blas_threads_after_numpy) for _ in range(2)]] == [1, 1]
