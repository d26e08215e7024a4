"""The built-in data set: deterministic, ImageNet-like, idempotent, learnable."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest
from PIL import Image

from stallscope.data.folders import scan_tree
from stallscope.data.synthetic import (
    INDEX_NAME,
    PHOTOS,
    SyntheticOptions,
    class_label,
    make_synthetic,
    render_image,
)
from stallscope.errors import UsageError

TINY = SyntheticOptions(classes=3, images_per_class=4, validation_fraction=0.25, seed=7,
                        long_side=(48, 64), workers=1)


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.jpg"))}


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    make_synthetic(tmp_path / "a", TINY)
    make_synthetic(tmp_path / "b", TINY)
    make_synthetic(tmp_path / "c", dataclasses.replace(TINY, seed=8))
    a, b, c = _files(tmp_path / "a"), _files(tmp_path / "b"), _files(tmp_path / "c")
    assert len(a) == 12 and a == b
    assert a.keys() == c.keys() and all(a[k] != c[k] for k in a)


def test_worker_processes_give_the_same_bytes_as_one(tmp_path):
    options = dataclasses.replace(TINY, classes=2, images_per_class=8)  # enough work for two processes
    make_synthetic(tmp_path / "one", options)
    make_synthetic(tmp_path / "two", dataclasses.replace(options, workers=2))
    assert _files(tmp_path / "one") == _files(tmp_path / "two")


def test_layout_splits_and_index(tmp_path):
    report = make_synthetic(tmp_path / "data", TINY)

    tree = scan_tree(tmp_path / "data")
    assert tree.has_splits and tree.splits == ("train", "validation")
    assert tree.labels == tuple(sorted(PHOTOS[:3])) == report.labels
    assert [p.path.name for p in tree.skipped] == [INDEX_NAME]  # the index, beside the splits
    for label in tree.labels:
        assert len([f for f in tree.split_files("train") if f.label_text == label]) == 3
        assert len([f for f in tree.split_files("validation") if f.label_text == label]) == 1
    for file in tree.files:
        with Image.open(file.path) as image:
            assert image.format == "JPEG" and image.mode == "RGB" and 48 <= max(image.size) <= 64
    index = json.loads((tmp_path / "data" / INDEX_NAME).read_text())
    assert index["options"] == TINY.identity() and "workers" not in index["options"]
    assert index["splits"] == {"train": 9, "validation": 3}
    assert sum(e[0] for e in index["files"].values()) == report.bytes_total
    assert report.images_per_split == {"train": 9, "validation": 3} and report.written == 12


def test_default_images_are_imagenet_sized():
    options = SyntheticOptions()
    for class_index, index in ((0, 0), (7, 3)):
        data = render_image(options, class_index, index)
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            assert image.format == "JPEG"
        assert 400 <= max(width, height) <= 600
        assert 1.0 <= max(width, height) / min(width, height) <= 1.6
        assert 20_000 <= len(data) <= 250_000  # ImageNet files are mostly 50-150 KB


def test_classes_are_learnable_from_colour_alone(tmp_path):
    """Nearest-centroid on colour histograms beats chance by far: the classes are really different."""
    options = SyntheticOptions(classes=10, images_per_class=6, validation_fraction=0.34, long_side=(40, 48), workers=1)
    make_synthetic(tmp_path / "data", options)
    tree = scan_tree(tmp_path / "data")

    def histogram(path):
        pixels = np.asarray(Image.open(path).convert("RGB")) // 64  # 4 levels per channel
        codes = pixels[..., 0] * 16 + pixels[..., 1] * 4 + pixels[..., 2]
        return np.bincount(codes.ravel(), minlength=64) / codes.size

    centroids = np.stack([
        np.mean([histogram(f.path) for f in tree.split_files("train") if f.label == label], axis=0)
        for label in range(len(tree.labels))
    ])
    validation = tree.split_files("validation")
    right = sum(
        int(np.argmin(np.abs(centroids - histogram(f.path)).sum(axis=1)) == f.label) for f in validation
    )
    assert len(validation) == 20 and right / len(validation) >= 0.6  # chance is 0.1


def test_more_classes_than_photographs_get_colour_families():
    labels = [class_label(c) for c in range(35)]
    assert len(set(labels)) == 35
    assert labels[0] == PHOTOS[0] and labels[10] == f"{PHOTOS[0]}_gbr" and labels[34].endswith("_brg")


def test_second_run_reuses_the_finished_data_set(tmp_path):
    make_synthetic(tmp_path / "data", TINY)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "data").rglob("*")}

    again = make_synthetic(tmp_path / "data", TINY)

    assert again.reused and again.written == 0 and again.kept == 12
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "data").rglob("*")} == before


def test_killed_run_resumes_and_ends_with_the_same_bytes(tmp_path):
    make_synthetic(tmp_path / "data", TINY)
    expected = _files(tmp_path / "data")
    # What a kill leaves: no index yet, a temporary file, a missing image, a damaged one.
    root = tmp_path / "data"
    (root / INDEX_NAME).rename(root / ".synthetic.partial.json")
    first, second = sorted(root.rglob("*.jpg"))[:2]
    (first.parent / f".{first.name}.tmp-99").write_bytes(b"half")
    first.unlink()
    second.write_bytes(b"not a jpeg")

    report = make_synthetic(root, TINY)

    assert not report.reused and report.written == 2 and report.kept == 10
    assert _files(root) == expected
    assert not list(root.rglob(".*"))  # temporaries and the partial marker are gone


def test_other_parameters_need_overwrite(tmp_path):
    make_synthetic(tmp_path / "data", TINY)
    bigger = dataclasses.replace(TINY, images_per_class=2, classes=2)
    with pytest.raises(UsageError, match=r"other parameters .*images_per_class 4 there, 2 asked.*--overwrite"):
        make_synthetic(tmp_path / "data", bigger)

    report = make_synthetic(tmp_path / "data", bigger, overwrite=True)

    assert report.images == 4 and len(_files(tmp_path / "data")) == 4  # nothing of the old set is left
    assert sorted(p.name for p in (tmp_path / "data" / "train").iterdir()) == sorted(PHOTOS[:2])


def test_refuses_a_directory_holding_something_else(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "holiday.jpg").write_bytes(b"mine")
    with pytest.raises(UsageError, match="not empty and holds no synthetic.json"):
        make_synthetic(tmp_path / "photos", TINY)
    assert (tmp_path / "photos" / "holiday.jpg").read_bytes() == b"mine"


@pytest.mark.parametrize("field, value", [
    ("classes", 0), ("classes", 1001), ("images_per_class", -1), ("validation_fraction", 1.0),
    ("seed", -3), ("quality", (95, 75)), ("quality", (0, 90)), ("long_side", (8, 600)), ("workers", 0),
])
def test_bad_options_name_the_field(field, value):
    with pytest.raises(UsageError, match=field):
        SyntheticOptions(**{field: value})


def test_split_sizes_keep_both_splits_populated():
    assert SyntheticOptions(images_per_class=60).split_sizes() == {"train": 48, "validation": 12}
    assert SyntheticOptions(images_per_class=2, validation_fraction=0.1).split_sizes() == {"train": 1, "validation": 1}
    assert SyntheticOptions(images_per_class=1, validation_fraction=0.5).split_sizes() == {"train": 1, "validation": 0}
    assert SyntheticOptions(images_per_class=5, validation_fraction=0).split_sizes() == {"train": 5, "validation": 0}
