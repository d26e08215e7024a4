"""open_source: image trees and record directories resolved to sorted files, labels and sizes."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from stallscope.errors import DataError, UsageError
from stallscope.pipeline.sources import available_splits, count_records, open_source
from stallscope.storage import location
from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.fuse_mount import why_no_fuse
from stallscope.storage.location import StorageError


def test_files_source_lists_images_with_folder_labels(coloured_tree):
    source = open_source("files", coloured_tree)
    assert source.kind == "files" and source.split == "train"
    assert source.labels == ("class_0", "class_1", "class_2")
    assert source.num_examples == 12 == len(source.files) == len(source.file_labels)
    assert all(isinstance(p, str) for p in source.files)  # no Path per image: see test_listing_memory
    files = [Path(p) for p in source.files]
    assert files == sorted(files)
    assert all(source.labels[label] == path.parent.name for path, label in zip(files, source.file_labels))
    assert source.total_bytes == sum(p.stat().st_size for p in files)
    assert {p.suffix for p in files} == {".jpg", ".png"}


def test_files_source_picks_the_split_and_names_missing_ones(image_tree_factory):
    root = image_tree_factory(classes=2, per_class=2, splits=("train", "validation"))
    validation = open_source("files", root, split="validation")
    assert validation.num_examples == 4
    assert all(Path(p).parts[-3] == "validation" for p in validation.files)
    with pytest.raises(UsageError, match=r"no split 'test'.*train, validation"):
        open_source("files", root, split="test")


def test_label_tree_is_the_train_split_only(tiny_tree):
    with pytest.raises(UsageError, match="train split"):
        open_source("files", tiny_tree, split="validation")


def test_non_images_are_ignored_and_reported(image_tree_factory, caplog):
    root = image_tree_factory(classes=2, per_class=2)
    (root / "class_00" / "notes.txt").write_text("not an image")
    (root / "class_00" / ".DS_Store").write_bytes(b"\0")
    source = open_source("files", root)
    assert source.num_examples == 4
    assert {p.name for p in source.ignored} == {"notes.txt", ".DS_Store"}
    assert "ignoring 2 file(s)" in caplog.text


def test_labels_file_fixes_the_order(image_tree_factory, tmp_path):
    root = image_tree_factory(classes=2, per_class=1)
    labels = tmp_path / "labels.txt"
    labels.write_text("class_01\nclass_00\nextra\n")
    source = open_source("files", root, labels_file=labels)
    assert source.labels == ("class_01", "class_00", "extra")
    assert [source.labels[i] for i in source.file_labels] == [Path(p).parent.name for p in source.files]


@pytest.mark.parametrize("kind", ["files", "records"])
def test_missing_path_is_a_usage_error(tmp_path, kind):
    with pytest.raises(UsageError, match="--dataset-path.*does not exist"):
        open_source(kind, tmp_path / "nope")


def test_unknown_kind_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="--source: expected one of files, records, got 'tar'"):
        open_source("tar", tmp_path)


def test_tree_without_images_is_a_data_error(tmp_path):
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "readme.md").write_text("x")
    with pytest.raises(DataError, match="no image files"):
        open_source("files", tmp_path)


def test_records_with_manifest(standard_records):
    source = open_source("records", standard_records)
    assert source.kind == "records" and source.schema == "standard"
    assert source.labels == ("class_0", "class_1", "class_2")
    assert source.num_examples == 12 and len(source.files) == 3 and source.file_labels == ()
    assert source.total_bytes == sum(p.stat().st_size for p in source.files)
    with pytest.raises(UsageError, match="no split 'validation'"):
        open_source("records", standard_records, split="validation")


def test_records_read_as_an_image_tree_name_the_source_flag(standard_records):
    with pytest.raises(UsageError, match=r"holds TFRecords \(manifest.json\), not an image tree; expected --source records"):
        open_source("files", standard_records)

def test_seed_converted_records_without_manifest(seed_records, caplog):
    source = open_source("records", seed_records)
    assert source.schema == "seed"
    assert source.num_examples == 12
    assert source.labels == ("0", "1", "2")  # the category values found
    assert [p.name for p in source.files] == ["out_0.tfrecord", "out_1.tfrecord"]
    assert "labels are the category values" in caplog.text


def test_labels_txt_beside_bare_records_is_used(tmp_path, seed_records):
    import shutil

    copy = tmp_path / "records"
    shutil.copytree(seed_records, copy)
    (copy / "labels.txt").write_text("a\nb\nc\nd\n")
    source = open_source("records", copy)
    assert source.labels == ("a", "b", "c", "d") and source.num_examples == 12


def test_directory_without_records_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="neither manifest.json nor"):
        open_source("records", tmp_path)


def test_count_records_reads_framing_and_names_truncation(seed_records, tmp_path):
    shard = seed_records / "out_0.tfrecord"
    assert count_records(shard) == 6
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(DataError, match="cut.tfrecord: truncated"):
        count_records(cut)


def test_bare_records_with_split_prefixes_pick_the_split(tmp_path, record_writer):
    from stallscope.records.schema import STANDARD

    write_shards, solid_image = record_writer
    write_shards(tmp_path, STANDARD, [(solid_image(20), 0)] * 3, shards=1, prefix="train-")
    write_shards(tmp_path, STANDARD, [(solid_image(20), 1)] * 2, shards=1, prefix="validation-")
    train = open_source("records", tmp_path, split="train")
    validation = open_source("records", tmp_path, split="validation")
    assert (train.num_examples, validation.num_examples) == (3, 2)
    assert train.schema == "standard" and [p.name for p in validation.files] == ["validation-0.tfrecord"]
    with pytest.raises(UsageError, match="no shards named test-"):
        open_source("records", tmp_path, split="test")


def test_a_files_source_holds_a_path_string_a_file_and_no_path_object(tmp_path):
    """ImageNet's 1.28 million training images held 703 MiB of Paths and ImageFiles before the first step."""
    files = 3000
    root = tmp_path / "tree"
    for c in range(30):
        folder = root / f"n{c:08d}"
        folder.mkdir(parents=True)
        for i in range(files // 30):
            (folder / f"n{c:08d}_{i}.JPEG").touch()  # listed and stat'ed, never opened here
    tracemalloc.start()
    try:
        source = open_source("files", root)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert source.num_examples == files and source.file_labels[-1] == 29
    # A path string, a label and a tuple's slots come to about 160 bytes here; a Path and an ImageFile a
    # file, as the source held before, came to 435 bytes held and 565 at the peak.
    assert held / files < 250, f"{held / files:.0f} bytes held a file"
    assert peak / files < 300, f"{peak / files:.0f} bytes a file at the peak"


@pytest.mark.skipif(bool(why_no_fuse()), reason=f"needs a FUSE mount: {why_no_fuse()}")
def test_a_tree_on_a_network_mount_is_listed_and_a_listing_that_stops_answering_is_one_line(tiny_tree, tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    with emulate(tiny_tree, kind="mount", mount_point=mount, latency_s=0.01, max_duration_s=120):
        source = open_source("files", mount)  # listed on a watched thread: the same files
        assert source.num_examples == 24 and all(p.startswith(str(mount)) for p in source.files)
        assert available_splits("files", mount) == ("train",)
    location.set_timeout(0.5)
    try:  # every listing call now waits 5 s: as far as a 0.5 s timeout knows, the server stopped answering
        with emulate(tiny_tree, kind="mount", mount_point=mount, latency_s=5.0, max_duration_s=120):
            with pytest.raises(StorageError, match=r"^--dataset-path: the file system \(fuse[.\w-]*\) listing '.+/mnt' "
                                                   r"did not answer for 0.5 s \(after 0 files\)"):
                open_source("files", mount)
    finally:
        location.set_timeout(location.DEFAULT_TIMEOUT_S)
