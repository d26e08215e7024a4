"""Sorting ILSVRC2012 validation images: a tiny fake archive sorted with the real shipped ground truth."""

from __future__ import annotations

import importlib.resources
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from stallscope.data.imagenet import (
    REPORT_NAME,
    ImagenetValOptions,
    load_ground_truth,
    prepare_imagenet_val,
    shipped_synsets,
)
from stallscope.errors import DataError, UsageError

NAMES = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 7)]
MTIME = 1_340_000_000  # archive members carry a time; placed files keep it


def _real_ground_truth() -> list[str]:
    """Read independently of the code under test: line i is the synset of image i+1."""
    path = importlib.resources.files("tensorflow_datasets") / "datasets/imagenet2012/validation_labels.txt"
    return path.read_text().splitlines()


@pytest.fixture
def val_images(image_tree_factory) -> dict[str, bytes]:
    """Six small JPEGs under the names of the first six ILSVRC2012 validation images."""
    tree = image_tree_factory(classes=1, per_class=len(NAMES), size=(40, 30))
    jpegs = sorted((tree / "class_00").iterdir())
    return {name: path.read_bytes() for name, path in zip(NAMES, jpegs)}


def _write_tar(path: Path, files: dict[str, bytes], prefix: str = "") -> Path:
    with tarfile.open(path, "w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size, info.mtime = len(data), MTIME
            archive.addfile(info, io.BytesIO(data))
    return path


def _write_folder(path: Path, files: dict[str, bytes]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root except the report, with its bytes and modification time."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), int(p.stat().st_mtime))
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != REPORT_NAME
    }


def test_tar_stream_sorted_by_the_shipped_ground_truth(tmp_path, val_images):
    truth = _real_ground_truth()
    assert len(truth) == 50_000 and truth[0] == "n01751748"  # val image 1 is a sea snake
    archive = _write_tar(tmp_path / "ILSVRC2012_img_val.tar", val_images)

    report = prepare_imagenet_val(archive, tmp_path / "images")

    for number, name in enumerate(NAMES, start=1):
        placed = tmp_path / "images" / truth[number - 1] / name
        assert placed.read_bytes() == val_images[name]
    assert (tmp_path / "images" / "n01751748" / NAMES[0]).is_file()
    assert report.images == 6 and report.placed == 6 and report.in_place == 0
    assert report.classes == len({truth[i] for i in range(6)})
    assert report.per_class == {s: truth[:6].count(s) for s in set(truth[:6])}
    assert report.unplaced == () and report.archive_error is None
    saved = json.loads((tmp_path / "images" / REPORT_NAME).read_text())
    assert saved["images"] == 6 and saved["complete"] is True and saved["source_kind"] == "tar"
    assert saved["min_per_class"] == report.min_per_class and saved["max_per_class"] == report.max_per_class


def test_gzipped_tar_with_a_folder_prefix(tmp_path, val_images):
    plain = _write_tar(tmp_path / "val.tar", val_images, prefix="val/")
    gz = tmp_path / "val.tar.gz"
    with tarfile.open(gz, "w:gz") as out, tarfile.open(plain) as src:
        for member in src:
            out.addfile(member, src.extractfile(member))
    report = prepare_imagenet_val(gz, tmp_path / "images")
    assert report.images == 6 and report.unplaced == ()


def test_ground_truth_and_synset_list_agree():
    truth = load_ground_truth()
    synsets = shipped_synsets()
    assert len(truth.synsets) == 50_000 and len(synsets) == 1000
    assert set(truth.synsets) == set(synsets) and truth.classes == 1000
    assert "tensorflow-datasets" in truth.source


def test_folder_source_copied_and_linked(tmp_path, val_images):
    source = _write_folder(tmp_path / "extracted", val_images)
    truth = _real_ground_truth()

    copied = prepare_imagenet_val(source, tmp_path / "copied")
    linked = prepare_imagenet_val(source, tmp_path / "linked", ImagenetValOptions(mode="link"))

    assert copied.images == linked.images == 6 and copied.mode == "copy" and linked.mode == "link"
    for number, name in enumerate(NAMES, start=1):
        original = source / name
        copy = tmp_path / "copied" / truth[number - 1] / name
        link = tmp_path / "linked" / truth[number - 1] / name
        assert copy.read_bytes() == original.read_bytes() and not os.path.samefile(copy, original)
        assert os.path.samefile(link, original)


def test_custom_labels_file(tmp_path, val_images):
    labels = tmp_path / "my_labels.txt"
    labels.write_text("cat\ndog\ncat\ndog\ncat\n")  # five lines for six images
    archive = _write_tar(tmp_path / "val.tar", val_images)

    report = prepare_imagenet_val(archive, tmp_path / "images", ImagenetValOptions(labels_file=labels))

    assert sorted(p.name for p in (tmp_path / "images" / "cat").iterdir()) == [NAMES[0], NAMES[2], NAMES[4]]
    assert sorted(p.name for p in (tmp_path / "images" / "dog").iterdir()) == [NAMES[1], NAMES[3]]
    assert report.per_class == {"cat": 3, "dog": 2} and report.min_per_class == 2 and report.max_per_class == 3
    assert [(u.name, "beyond the ground truth" in u.reason) for u in report.unplaced] == [(NAMES[5], True)]
    assert "my_labels.txt" in report.ground_truth


@pytest.mark.parametrize("text, message", [
    ("", "holds no labels"),
    ("n01\n\nn02\n", "line 2 is blank"),
    ("n01\n../escape\n", "cannot be a class folder name"),
])
def test_bad_labels_file_is_one_clear_error(tmp_path, val_images, text, message):
    labels = tmp_path / "labels.txt"
    labels.write_text(text)
    source = _write_folder(tmp_path / "src", val_images)
    with pytest.raises(UsageError, match=message) as exc:
        prepare_imagenet_val(source, tmp_path / "out", ImagenetValOptions(labels_file=labels))
    assert "labels.txt" in str(exc.value) and "\n" not in str(exc.value)


def test_labels_path_through_a_file_is_one_clear_error(tmp_path, val_images):
    source = _write_folder(tmp_path / "src", val_images)
    not_a_folder = tmp_path / "labels.txt"
    not_a_folder.write_text("n01\n")
    with pytest.raises(UsageError, match="--labels: cannot read"):
        prepare_imagenet_val(source, tmp_path / "out", ImagenetValOptions(labels_file=not_a_folder / "x"))


def test_every_unplaceable_file_is_reported_with_its_reason(tmp_path, val_images):
    source = _write_folder(tmp_path / "src", val_images)
    (source / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n")
    (source / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (source / "ILSVRC2012_val_00099999.JPEG").write_bytes(val_images[NAMES[0]])
    (source / "ILSVRC2012_val_00000007.JPEG").symlink_to(source / "gone.JPEG")  # cannot be read
    (source / "nested").mkdir()
    (source / "nested" / NAMES[1]).write_bytes(val_images[NAMES[1]])

    report = prepare_imagenet_val(source, tmp_path / "images")

    reasons = {u.name: u.reason for u in report.unplaced}
    assert set(reasons) == {"LOC_val_solution.csv", ".DS_Store", "ILSVRC2012_val_00099999.JPEG",
                            "ILSVRC2012_val_00000007.JPEG", "nested/" + NAMES[1]}
    assert "does not match ILSVRC2012_val_NNNNNNNN.JPEG" in reasons["LOC_val_solution.csv"]
    assert "beyond the ground truth (50000 images)" in reasons["ILSVRC2012_val_00099999.JPEG"]
    assert reasons["ILSVRC2012_val_00000007.JPEG"].startswith("unreadable")
    assert "second copy" in reasons["nested/" + NAMES[1]]
    assert report.images == 6
    saved = json.loads((tmp_path / "images" / REPORT_NAME).read_text())
    assert {u["name"] for u in saved["unplaced"]} == set(reasons)


def test_running_twice_gives_the_same_tree_without_rewriting(tmp_path, val_images):
    archive = _write_tar(tmp_path / "val.tar", val_images)
    first = prepare_imagenet_val(archive, tmp_path / "images")
    before = _tree(tmp_path / "images")
    inodes = {p: p.stat().st_ino for p in (tmp_path / "images").rglob("*.JPEG")}

    second = prepare_imagenet_val(archive, tmp_path / "images")

    assert first.placed == 6 and second.placed == 0 and second.in_place == 6
    assert _tree(tmp_path / "images") == before
    assert {p: p.stat().st_ino for p in (tmp_path / "images").rglob("*.JPEG")} == inodes  # not rewritten
    assert second.per_class == first.per_class


def test_a_second_run_passes_over_the_images_in_place_without_reading_them(tmp_path):
    big = {name: b"\xff\xd8\xff" + bytes([i]) * 600_000 for i, name in enumerate(NAMES)}
    archive = _write_tar(tmp_path / "val.tar", big)

    def bytes_read() -> int:
        with open("/proc/self/io") as io_file:
            return next(int(line.split()[1]) for line in io_file if line.startswith("rchar:"))

    before = bytes_read()
    prepare_imagenet_val(archive, tmp_path / "images")
    first = bytes_read() - before
    before = bytes_read()
    again = prepare_imagenet_val(archive, tmp_path / "images")
    second = bytes_read() - before

    # Both read the shipped ground truth (about 0.5 MB); only the first reads the images.
    assert again.in_place == 6 and first - second > archive.stat().st_size * 0.9, (first, second)


def test_a_killed_run_is_finished_by_the_next(tmp_path, val_images):
    archive = _write_tar(tmp_path / "val.tar", val_images)
    prepare_imagenet_val(archive, tmp_path / "reference")
    expected = _tree(tmp_path / "reference")
    # What a kill leaves: a temporary file, a missing file, and a file that is not the source's.
    out = tmp_path / "images"
    prepare_imagenet_val(archive, out)
    first = next(out.rglob(NAMES[0]))
    (first.parent / f".{NAMES[0]}.tmp-4242").write_bytes(b"half")
    next(out.rglob(NAMES[1])).unlink()
    next(out.rglob(NAMES[2])).write_bytes(b"not the source's bytes")

    report = prepare_imagenet_val(archive, out)

    assert report.placed == 2 and report.in_place == 4
    assert _tree(out) == expected


def test_rerun_with_other_ground_truth_moves_files_and_removes_the_old_places(tmp_path, val_images):
    source = _write_folder(tmp_path / "src", val_images)
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\na\nb\na\nb\n")
    prepare_imagenet_val(source, tmp_path / "fresh", ImagenetValOptions(labels_file=labels))

    prepare_imagenet_val(source, tmp_path / "images")  # shipped ground truth first
    report = prepare_imagenet_val(source, tmp_path / "images", ImagenetValOptions(labels_file=labels))

    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == ["a", "b", REPORT_NAME]
    assert {k: v[0] for k, v in _tree(tmp_path / "images").items()} == {k: v[0] for k, v in _tree(tmp_path / "fresh").items()}
    assert len(report.removed) == 6 and all("ground truth puts it in" in r.reason for r in report.removed)


@pytest.mark.parametrize("cut_in", ["data", "header"])
def test_truncated_archive_keeps_what_came_before_and_says_where_it_broke(tmp_path, val_images, cut_in):
    archive = _write_tar(tmp_path / "val.tar", val_images)
    with tarfile.open(archive) as whole:
        third = whole.getmembers()[2]
    cut = tmp_path / "cut.tar"
    end = third.offset_data + 100 if cut_in == "data" else third.offset + 100
    cut.write_bytes(archive.read_bytes()[:end])

    report = prepare_imagenet_val(cut, tmp_path / "images")

    assert report.images == 2
    if cut_in == "data":
        assert f"in {NAMES[2]}" in report.archive_error
        assert [u.name for u in report.unplaced] == [NAMES[2]] and report.unplaced[0].reason.startswith("unreadable")
    else:  # tarfile alone would end here quietly, as if the archive were whole
        assert f"after {NAMES[1]}" in report.archive_error
    assert "cut.tar" in report.archive_error
    assert not any(p.name.startswith(".") for p in (tmp_path / "images").rglob("*"))  # no half file
    assert json.loads((tmp_path / "images" / REPORT_NAME).read_text())["complete"] is False


def test_damaged_header_is_not_taken_for_the_end(tmp_path, val_images):
    archive = _write_tar(tmp_path / "val.tar", val_images)
    with tarfile.open(archive) as whole:
        fourth = whole.getmembers()[3]
    data = bytearray(archive.read_bytes())
    data[fourth.offset + 3] ^= 0xFF  # a flipped byte in a name: the header checksum fails
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(bytes(data))

    report = prepare_imagenet_val(damaged, tmp_path / "images")

    assert report.images == 3 and "bad checksum" in report.archive_error


def test_bad_sources_are_clear_errors(tmp_path, val_images):
    with pytest.raises(UsageError, match="does not exist"):
        prepare_imagenet_val(tmp_path / "missing.tar", tmp_path / "out")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not an archive " * 40)
    with pytest.raises(DataError, match="junk.tar: not a tar archive"):
        prepare_imagenet_val(junk, tmp_path / "out")
    archive = _write_tar(tmp_path / "val.tar", val_images)
    with pytest.raises(UsageError, match="--link"):
        prepare_imagenet_val(archive, tmp_path / "out", ImagenetValOptions(mode="link"))
    with pytest.raises(UsageError, match="mode"):
        ImagenetValOptions(mode="move")


def test_output_around_the_source_folder_is_refused(tmp_path, val_images):
    source = _write_folder(tmp_path / "images" / "raw", val_images)
    for output in (tmp_path / "images", source):
        with pytest.raises(UsageError, match="holds the SOURCE folder"):
            prepare_imagenet_val(source, output)
    assert sorted(p.name for p in source.iterdir()) == NAMES  # untouched


def test_a_non_jpeg_named_like_a_validation_image_is_not_placed(tmp_path, val_images):
    files = dict(val_images)
    files[NAMES[2]] = b"GIF89a\0\0"  # 8 bytes, named like image 3
    for kind, source in (("folder", _write_folder(tmp_path / "src", files)), ("tar", _write_tar(tmp_path / "v.tar", files))):
        report = prepare_imagenet_val(source, tmp_path / f"images-{kind}")
        reasons = {u.name: u.reason for u in report.unplaced}
        assert reasons == {NAMES[2]: "not a JPEG (8 bytes, starting 47494638)"}, kind
        assert report.images == 5 and not list((tmp_path / f"images-{kind}").rglob(NAMES[2])), kind


def test_an_empty_source_is_an_error_and_leaves_no_output(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    output = tmp_path / "new" / "images"
    with pytest.raises(DataError, match="holds no ILSVRC2012 validation image"):
        prepare_imagenet_val(empty, output)
    assert not (tmp_path / "new").exists(), "the failed run left the folders it made"
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(DataError):
        prepare_imagenet_val(empty, kept)
    assert kept.is_dir(), "a folder the user had is never removed"
