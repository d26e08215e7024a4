"""Nothing of the user's is touched: a command pointed at a folder holding the user's own files, a link of
theirs, or another data set's conversion refuses in one line, exit code 2, before any work, and leaves
every byte where it was (docs/reference/errors.md: "stallscope never replaces your files")."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

LIMIT_S = 180  # TF's import, on a loaded machine
TRAIN = ["--accelerator", "emulated:1ms", "--steps", "2", "--image_size", "32", "--batch_size", "4"]


def _digests(folder: Path) -> dict[str, str]:
    """Every file below `folder` (links read through) by its bytes, to show nothing changed."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.timeout(LIMIT_S * 2)
def test_train_into_a_folder_of_the_users_own_files_touches_none(faults, tiny_tree, tmp_path):
    """`train --log_path runs/u4` overwrote the user's steps.csv, pipeline.json and summary.json there."""
    mine = tmp_path / "u4"
    mine.mkdir()
    for name, text in (("steps.csv", "my,own,columns\n1,2,3\n"), ("summary.json", '{"mine": true}\n')):
        (mine / name).write_text(text)
    before = _digests(mine)
    outcome = faults.run("train --log_path holding the user's own files", [
        "train", "--dataset_path", tiny_tree, "--log_path", mine, *TRAIN], LIMIT_S)
    outcome.check(rc=2, within_s=LIMIT_S)
    assert "--log_path" in outcome.stderr_lines[0] and "not written by stallscope" in outcome.stderr_lines[0]
    assert _digests(mine) == before and sorted(os.listdir(mine)) == ["steps.csv", "summary.json"]


@pytest.mark.timeout(LIMIT_S * 2)
def test_train_never_writes_through_a_link_of_the_users(faults, tiny_tree, tmp_path):
    """With steps.csv a link to a file outside the folder, that file was overwritten with step rows."""
    outside = tmp_path / "elsewhere" / "precious.txt"
    outside.parent.mkdir()
    outside.write_text("the user's own text\n")
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(outside, run / "steps.csv")
    outcome = faults.run("train --log_path with a link of the user's", [
        "train", "--dataset_path", tiny_tree, "--log_path", run, *TRAIN], LIMIT_S)
    outcome.check(rc=2, within_s=LIMIT_S)
    assert "steps.csv" in outcome.stderr_lines[0], outcome.stderr_lines
    assert outside.read_text() == "the user's own text\n" and os.path.islink(run / "steps.csv")


@pytest.mark.timeout(LIMIT_S * 2)
def test_convert_into_another_data_sets_conversion_deletes_none_of_its_shards(faults, image_tree_factory, tmp_path):
    """A finished conversion of one source, then `convert` of another into the same folder: its shards were
    deleted and replaced with no note."""
    first, second = image_tree_factory(classes=2, per_class=4), image_tree_factory(classes=3, per_class=2, seed=1)
    out = tmp_path / "records"
    faults.run("convert, a first source", ["convert", first, "--output_path", out, "--shards", "2",
                                           "--no-progress"], LIMIT_S).check(rc=0, within_s=LIMIT_S, stderr_lines=None)
    before = _digests(out)
    outcome = faults.run("convert of another source into its folder", [
        "convert", second, "--output_path", out, "--shards", "2", "--no-progress"], LIMIT_S)
    outcome.check(rc=2, within_s=LIMIT_S)
    assert str(second) in outcome.stderr_lines[0] and "--replace" in outcome.stderr_lines[0], outcome.stderr_lines
    assert _digests(out) == before
