"""convert_tree end to end on real files: accounting, repairs, schemas, labels, sharding, output dir rules."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stallscope.cli.main import main
from stallscope.errors import DataError, UsageError
from stallscope.records.convert import ConvertOptions, convert_tree
from stallscope.records.manifest import load_manifest
from stallscope.records.schema import SEED, STANDARD, parse_example
from stallscope.records.verify import read_frames


def _records(out: Path, manifest) -> list[dict]:
    """Every record of every shard, parsed with TF (the way training reads them)."""
    import tensorflow as tf

    schema = {"standard": STANDARD, "seed": SEED}[manifest.schema]
    rows = []
    for split in manifest.splits:
        files = [str(p) for p in manifest.shard_paths(out, split)]
        for parsed in tf.data.TFRecordDataset(files).map(lambda s: parse_example(schema, s)):
            image = tf.io.decode_jpeg(parsed["image"], channels=3)
            rows.append({"split": split, "label": int(parsed["label"]), "filename": parsed["filename"].numpy(),
                         "shape": tuple(image.shape)})
    return rows


def _all_files(root: Path) -> set[bytes]:
    """Every regular file, link and special file under root, as relative byte names."""
    base = os.fsencode(root)
    found = set()
    for dirpath, dirnames, filenames in os.walk(base):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            found.add(os.path.relpath(os.path.join(dirpath, name), base))
    return found


def _skipped_names(manifest) -> dict[bytes, str]:
    return {bytes.fromhex(e["path_hex"]) if "path_hex" in e else e["path"].encode(): e["reason"] for e in manifest.skipped}


def test_messy_tree_every_file_ends_where_the_manifest_says(messy_tree, tmp_path):
    root, expect = messy_tree["root"], messy_tree["expect"]
    out = tmp_path / "out"
    report = convert_tree(ConvertOptions(root, out, shards=2, workers=1, max_side=200))
    manifest = load_manifest(out)
    rows = _records(out, manifest)
    recorded = {r["filename"] for r in rows}
    skipped = _skipped_names(manifest)
    repaired = {e["path"].encode(): e["actions"] for e in manifest.repaired}

    assert recorded | set(skipped) == _all_files(root) == set(expect)
    assert not recorded & set(skipped)
    for name, outcome in expect.items():
        if outcome in ("ok", "repaired"):
            assert name in recorded, name
            assert (name in repaired) == (outcome == "repaired"), (name, repaired.get(name))
        else:
            assert skipped[name] == outcome, name
    assert all(shape[2] == 3 for shape in (r["shape"] for r in rows))
    assert max(max(r["shape"][:2]) for r in rows) <= 200  # --max-side applied to big.jpg
    assert report.examples == len(rows) == sum(1 for v in expect.values() if v in ("ok", "repaired"))
    assert report.skipped_by_reason["hidden file"] == 2
    assert set(manifest.splits) == {"train", "validation"}
    assert [s.file for s in manifest.splits["train"].shards] == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    # the manifest stays valid ASCII JSON, a non-UTF-8 name readable and recoverable byte for byte
    entry = next(e for e in json.loads((out / "manifest.json").read_text(encoding="ascii"))["skipped"] if "path_hex" in e)
    assert entry["path"] == "train/dog/odd_\\xff.jpg" and bytes.fromhex(entry["path_hex"]) == b"train/dog/odd_\xff.jpg"
    assert b"train/cat/latin1_\xe9\xff.jpg" in recorded
    actions = repaired[b"train/cat/rotated.jpg"]
    assert any("EXIF orientation 6" in a for a in actions)
    assert not list(out.glob(".*")), "temporaries or state left behind"


def test_round_trip_both_schemas_and_standard_extras(tiny_tree, tmp_path):
    import tensorflow as tf

    for schema in ("standard", "seed"):
        out = tmp_path / schema
        convert_tree(ConvertOptions(tiny_tree, out, shards=3, workers=1, schema=schema, seed=7))
        manifest = load_manifest(out)
        rows = _records(out, manifest)
        assert len(rows) == 24 and manifest.labels == ("class_00", "class_01", "class_02")
        for row in rows:
            folder = row["filename"].split(b"/")[0].decode()
            assert row["label"] == manifest.labels.index(folder)
            assert row["shape"] == (60, 80, 3)
        # shuffled across shards: no shard holds a single class
        first = [r["label"] for r in rows[:8]]
        assert len(set(first)) > 1
    example = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(str(tmp_path / "standard" / "train-00000-of-00003.tfrecord")))).numpy())
    feature = example.features.feature
    assert feature["image/height"].int64_list.value == [60] and feature["image/width"].int64_list.value == [80]
    assert feature["image/format"].bytes_list.value == [b"jpeg"]
    assert feature["image/class/text"].bytes_list.value[0].startswith(b"class_0")
    seed_keys = set(tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(str(tmp_path / "seed" / "train-00000-of-00003.tfrecord")))).numpy()).features.feature)
    assert seed_keys == {"name", "category", "data"}


def test_jpeg_kept_byte_for_byte(tiny_tree, tmp_path):
    out = tmp_path / "out"
    convert_tree(ConvertOptions(tiny_tree, out, shards=1, workers=1))
    import tensorflow as tf

    for serialized in tf.data.TFRecordDataset(str(out / "train-00000-of-00001.tfrecord")):
        parsed = parse_example(STANDARD, serialized)
        assert parsed["image"].numpy() == (tiny_tree / parsed["filename"].numpy().decode()).read_bytes()


def test_labels_file_fixes_order_and_is_written_beside(image_tree_factory, tmp_path):
    root = image_tree_factory(classes=3, per_class=2)
    labels = tmp_path / "labels.txt"
    labels.write_text("# mine\nclass_02\nclass_00\nextra_unused\nclass_01\n")
    out = tmp_path / "out"
    convert_tree(ConvertOptions(root, out, labels_file=labels, shards=1, workers=1))
    manifest = load_manifest(out)
    assert manifest.labels == ("class_02", "class_00", "extra_unused", "class_01")
    assert (out / "labels.txt").read_text().splitlines() == list(manifest.labels)
    for row in _records(out, manifest):
        assert manifest.labels[row["label"]] == row["filename"].split(b"/")[0].decode()
    # without the file: sorted folder names
    out2 = tmp_path / "out2"
    convert_tree(ConvertOptions(root, out2, shards=1, workers=1))
    assert load_manifest(out2).labels == ("class_00", "class_01", "class_02")


def test_folder_missing_from_labels_file_is_an_error(image_tree_factory, tmp_path):
    root = image_tree_factory(classes=3, per_class=1)
    labels = tmp_path / "labels.txt"
    labels.write_text("class_00\nclass_01\n")
    with pytest.raises(UsageError, match="class_02.*not in the labels file"):
        convert_tree(ConvertOptions(root, tmp_path / "out", labels_file=labels, workers=1))


def test_size_per_record_follows_seed_semantics(image_tree_factory, tmp_path):
    root = image_tree_factory(classes=2, per_class=10)
    sizes = sorted(p.stat().st_size for p in root.rglob("*.jpg"))
    target = sizes[-1] * 4  # every shard but the last reaches it within one more image
    out = tmp_path / "out"
    report = convert_tree(ConvertOptions(root, out, size_per_record=target, workers=1))
    shards = report.manifest.splits["train"].shards
    assert len(shards) >= 3 and sum(s.records for s in shards) == 20
    assert all(s.records in (4, 5, 6) for s in shards[:-1])
    assert report.manifest.options["size_per_record"] == target


def test_parallel_workers_write_the_same_bytes(image_tree_factory, tmp_path):
    root = image_tree_factory(classes=2, per_class=12, splits=("train", "validation"))
    one, two = tmp_path / "one", tmp_path / "two"
    convert_tree(ConvertOptions(root, one, shards=3, workers=1))
    seen = []
    report = convert_tree(ConvertOptions(root, two, shards=3, workers=2), progress=lambda d, t: seen.append((d, t)))
    for shard in (one.glob("*.tfrecord")):
        assert (two / shard.name).read_bytes() == shard.read_bytes()
    assert seen[-1] == (48, 48) and report.examples == 48


def test_per_split_shard_counts(image_tree_factory, tmp_path):
    root = image_tree_factory(classes=2, per_class=4, splits=("train", "validation"))
    report = convert_tree(ConvertOptions(root, tmp_path / "out", shards=4, split_shards=(("validation", 2),), workers=1))
    assert len(report.manifest.splits["train"].shards) == 4
    assert len(report.manifest.splits["validation"].shards) == 2
    with pytest.raises(UsageError, match="no split 'test'"):
        convert_tree(ConvertOptions(root, tmp_path / "x", split_shards=(("test", 2),), workers=1))
    with pytest.raises(UsageError, match="only 8 image"):
        convert_tree(ConvertOptions(root, tmp_path / "y", shards=9, workers=1))


def test_output_directory_rules(tiny_tree, image_tree_factory, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(UsageError, match="precious.txt"):
        convert_tree(ConvertOptions(tiny_tree, foreign, workers=1))
    root = image_tree_factory(classes=1, per_class=2)
    with pytest.raises(UsageError, match="inside --dataset_path"):
        convert_tree(ConvertOptions(root, root / "records", workers=1))
    # a second conversion with fewer shards, told to replace the first, removes the first one's extra shards
    out = tmp_path / "out"
    convert_tree(ConvertOptions(tiny_tree, out, shards=4, workers=1))
    convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1, replace=True))
    assert sorted(p.name for p in out.glob("*.tfrecord")) == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]


def test_nothing_usable_is_a_data_error(tmp_path):
    root = tmp_path / "bad"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.jpg").write_bytes(b"nope")
    with pytest.raises(DataError, match="no usable images"):
        convert_tree(ConvertOptions(root, tmp_path / "out", workers=1))
    assert load_manifest(tmp_path / "out").skipped[0]["reason"] == "not an image"


@pytest.mark.parametrize("kwargs, match", [
    ({"shards": 2, "size_per_record": 100}, "both given"),
    ({"shards": 0}, "shards"),
    ({"schema": "tfds"}, "schema: expected one of standard, seed"),
    ({"jpeg_quality": 101}, "jpeg_quality"),
    ({"max_side": -1}, "max_side"),
])
def test_options_reject_bad_values(kwargs, match, tmp_path):
    with pytest.raises(UsageError, match=match):
        ConvertOptions(tmp_path, tmp_path / "out", **kwargs)


def test_default_workers_are_the_cores_this_process_may_use(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert ConvertOptions(tmp_path, tmp_path / "out").resolved_workers == 4  # cores + 1, not os.cpu_count() + 1
    assert ConvertOptions(tmp_path, tmp_path / "out", workers=5).resolved_workers == 5


def test_cli_convert_seed_flags_and_summary(tiny_tree, tmp_path, capsys):
    out = tmp_path / "tfrecords"
    rc = main(["convert", f"--dataset_path={tiny_tree}", "--size_per_record", "1M", f"--output_path={out}", "--workers", "1"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "converted 24 images into 1 shards" in text and "images/s" in text and "skipped 0 files" in text
    frames = list(read_frames((out / "train-00000-of-00001.tfrecord").read_bytes()))
    assert len(frames) == 24


def test_cli_check_and_quality_reach_the_manifest(tiny_tree, tmp_path):
    out = tmp_path / "tfrecords"
    assert main(["convert", str(tiny_tree), "--output_path", str(out), "--workers", "1", "--check", "full",
                 "--jpeg-quality", "80", "--no-progress"]) == 0
    options = json.loads((out / "manifest.json").read_text())["options"]
    assert (options["check"], options["jpeg_quality"]) == ("full", 80)
    out = tmp_path / "default"
    assert main(["convert", str(tiny_tree), "--output_path", str(out), "--workers", "1", "--no-progress"]) == 0
    options = json.loads((out / "manifest.json").read_text())["options"]
    assert (options["check"], options["jpeg_quality"]) == ("stream", "keep")


@pytest.mark.parametrize("argv, needle", [
    (["convert", "/no/such/dir", "--output_path", "{tmp}/o"], "/no/such/dir"),
    (["convert", "{tree}", "--shards", "0"], "--shards"),
    (["convert", "{tree}", "--shards", "2", "--size_per_record", "5M"], "not allowed with argument"),
    (["convert", "{tree}", "--schema", "tfds"], "--schema"),
    (["convert", "{tree}", "--labels", "/no/labels.txt"], "--labels"),
    (["convert", "{tree}", "--size_per_record", "lots"], "--size_per_record"),
    (["convert", "{tree}", "--jpeg-quality", "best"], "--jpeg-quality"),
    (["convert", "{tree}", "--check", "pixels"], "--check"),
])
def test_cli_errors_are_one_line_exit_2(argv, needle, tiny_tree, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path, tree=tiny_tree) for a in argv] + ["--output_path", str(tmp_path / "out")]
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and needle in err, err


def test_the_data_sets_own_index_is_not_reported_as_a_skipped_file(image_tree_factory, tmp_path):
    """The built-in data set keeps synthetic.json at its root: accounted for in the manifest under its own
    reason, named in the summary as not converted, and not counted among skipped (lost) files."""
    from stallscope.data import synthetic
    from stallscope.records.convert import format_summary

    root = image_tree_factory(classes=2, per_class=3)
    (root / synthetic.INDEX_NAME).write_text("{}")
    (root / "notes.txt").write_text("a user's stray file")
    report = convert_tree(ConvertOptions(root, tmp_path / "out", workers=1))
    reasons = {e["path"]: e["reason"] for e in report.manifest.skipped}
    assert reasons == {"synthetic.json": "the data set's own index", "notes.txt": "not inside a class folder"}
    text = "\n".join(format_summary(report))
    assert "skipped 1 file(s): 1 not inside a class folder" in text
    assert "not converted: synthetic.json (the data set's own index" in text


def test_the_reports_prepare_leaves_in_a_split_are_its_own_index_not_stray_files(tmp_path, image_tree_factory):
    from stallscope.data.imagenet import REPORT_NAME

    root = image_tree_factory(classes=2, per_class=3, splits=("train", "validation"))
    for split in ("train", "validation"):  # as `prepare imagenet-train -o root/train` and imagenet-val leave them
        (root / split / REPORT_NAME).write_text("{}")
    report = convert_tree(ConvertOptions(root, tmp_path / "out", workers=1))
    reasons = {e["path"]: e["reason"] for e in report.manifest.skipped}
    assert reasons == {f"{split}/{REPORT_NAME}": "the data set's own index" for split in ("train", "validation")}
