"""scan_tree: both layouts, label order, and a reason for every file it cannot place."""

from __future__ import annotations

import os

import pytest

from stallscope.data.folders import read_labels_file, scan_tree
from stallscope.errors import DataError, UsageError


def _touch(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_label_layout_sorted_labels(image_tree_factory):
    tree = scan_tree(image_tree_factory(classes=3, per_class=2))
    assert tree.labels == ("class_00", "class_01", "class_02") and not tree.has_splits
    assert tree.splits == ("train",) and len(tree.files) == 6
    assert {(f.label, f.label_text) for f in tree.files} == {(0, "class_00"), (1, "class_01"), (2, "class_02")}


def test_split_layout(image_tree_factory):
    tree = scan_tree(image_tree_factory(classes=2, per_class=2, splits=("validation", "train")))
    assert tree.has_splits and tree.splits == ("train", "validation")
    assert len(tree.split_files("validation")) == 4


def test_labels_file_fixes_indices(image_tree_factory, tmp_path):
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("class_01\n\n# comment\nclass_00\n")
    tree = scan_tree(image_tree_factory(classes=2, per_class=1), read_labels_file(labels_file))
    assert tree.labels == ("class_01", "class_00")
    assert {f.label_text: f.label for f in tree.files} == {"class_01": 0, "class_00": 1}


@pytest.mark.parametrize("text, match", [("", "holds no labels"), ("a\nb\na\n", "'a' more than once")])
def test_bad_labels_files(tmp_path, text, match):
    path = tmp_path / "labels.txt"
    path.write_text(text)
    with pytest.raises(UsageError, match=match):
        read_labels_file(path)
    with pytest.raises(UsageError, match="does not exist"):
        read_labels_file(tmp_path / "missing.txt")


def test_unreadable_labels_files_are_usage_errors(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(UsageError, match="not a UTF-8 text file"):
        read_labels_file(path)
    with pytest.raises(UsageError, match="is a directory"):
        read_labels_file(tmp_path)
    with pytest.raises(UsageError, match="cannot read .*Not a directory"):  # a path through a file
        read_labels_file(path / "labels.txt")


def test_every_unplaceable_file_has_a_reason(tmp_path):
    root = tmp_path / "tree"
    _touch(root / "cat" / "a.jpg")
    _touch(root / "cat" / "sub" / "b.jpg")  # nested: still the cat class
    _touch(root / "cat" / ".DS_Store")
    _touch(root / ".git" / "config")
    _touch(root / "README.md")
    os.symlink(root / "nowhere.jpg", root / "cat" / "gone.jpg")
    os.symlink(root / "cat", root / "cat" / "loop")
    name = os.fsencode(root / "cat") + b"/caf\xe9 \xff.jpg"
    with open(name, "wb") as handle:
        handle.write(b"x")
    tree = scan_tree(root)
    placed = {f.path.relative_to(root).as_posix() for f in tree.files}
    assert placed == {"cat/a.jpg", "cat/sub/b.jpg", os.fsdecode(b"cat/caf\xe9 \xff.jpg")}
    reasons = {s.path.relative_to(root).as_posix(): s.reason for s in tree.skipped}
    assert reasons == {
        "cat/.DS_Store": "hidden file",
        ".git/config": "hidden file",
        "README.md": "not inside a class folder",
        "cat/gone.jpg": "dangling link",
        "cat/loop": "link to a directory",
    }


def test_missing_or_empty_roots(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        scan_tree(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        scan_tree(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        scan_tree(tmp_path / "empty")


def test_an_unreadable_class_folder_is_reported_not_lost(image_tree_factory, monkeypatch):
    """Root reads every folder here, so the kernel's EACCES is injected at os.scandir for one folder."""
    import os

    root = image_tree_factory(classes=2, per_class=2)
    locked = root / "class_01"
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path) == os.fspath(locked):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    tree = scan_tree(root)
    assert {f.label_text for f in tree.files} == {"class_00"}
    assert [(s.path, s.reason) for s in tree.skipped] == [(locked, "unreadable folder (Permission denied)")]


def _cat_cat_empty(root):
    """`Cat/` and `cat/` with a file each, `empty/` with nothing but a hidden file, `dog/` with one."""
    for name in ("Cat", "cat", "dog"):
        _touch(root / name / "a.jpg")
    _touch(root / "empty" / ".DS_Store")
    return root


def test_an_empty_class_folder_is_skipped_and_labels_differing_by_case_are_warned_about(tmp_path, caplog):
    tree = scan_tree(_cat_cat_empty(tmp_path / "tree"))
    assert tree.labels == ("Cat", "cat", "dog")  # no label for empty/, so no label with 0 examples
    assert [s.reason for s in tree.skipped if s.path.name == "empty"] == ["empty class folder (not a label)"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    assert f"class folder {tmp_path / 'tree' / 'empty'} holds no files: skipped, not a label" in warnings
    assert "class folders 'Cat' and 'cat' differ only by case: they are 2 labels; merge them if they are one class" \
        in warnings


def test_an_empty_class_folder_the_labels_file_names_stays_a_label(tmp_path, caplog):
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("dog\nempty\nCat\ncat\n")
    tree = scan_tree(_cat_cat_empty(tmp_path / "tree"), read_labels_file(labels_file))
    assert tree.labels == ("dog", "empty", "Cat", "cat")
    assert not [s for s in tree.skipped if s.path.name == "empty"]
    assert "class folder 'empty' holds no files: kept as label 1, with 0 examples, because --labels names it" in [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_convert_says_what_it_did_with_the_empty_folder_in_its_summary(image_tree_factory, tmp_path, capsys, caplog):
    from stallscope.cli.main import main

    root = image_tree_factory(classes=3, per_class=2)
    for old, new in (("class_00", "Cat"), ("class_01", "cat"), ("class_02", "dog")):
        (root / old).rename(root / new)
    (root / "empty").mkdir()
    code = main(["convert", str(root), "--output_path", str(tmp_path / "records")])
    out = capsys.readouterr().out
    assert code == 0
    assert "converted 6 images" in out and "skipped 1 file(s): 1 empty class folder (not a label)" in out
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name.endswith("folders")]
    assert len(warnings) == 2, warnings
    labels = (tmp_path / "records" / "labels.txt").read_text().split()
    assert labels == ["Cat", "cat", "dog"]
