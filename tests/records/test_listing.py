"""The listing and plan a conversion holds for every file: small enough for ImageNet's 1.28 million on
one machine (and for the launcher of `--runner beam` at ten times that), whatever root it is given."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

from stallscope.records.convert import ConvertOptions, convert_tree, plan_conversion


def _empty_tree(root: Path, classes: int, per_class: int) -> Path:
    """ImageNet's shape in miniature: empty files (candidates until their content is judged)."""
    for c in range(classes):
        folder = root / f"n{c:08d}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            (folder / f"n{c:08d}_{i}.JPEG").touch()
    return root


def test_a_plan_holds_a_few_hundred_bytes_a_file_and_no_path_object(tmp_path):
    files = 3000
    root = _empty_tree(tmp_path / "tree", classes=30, per_class=files // 30)
    tracemalloc.start()
    try:
        plan = plan_conversion(ConvertOptions(root, tmp_path / "out", shards=4))
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert len(plan.candidates) == files and sum(len(s.items) for s in plan.shards) == files
    assert plan.tree.files == ()  # the files went straight into candidates, not into a Path each
    # A Path and an ImageFile a file, as the plan held before, came to 670 bytes held and 865 at the peak.
    assert held / files < 300, f"{held / files:.0f} bytes held a file"
    assert peak / files < 600, f"{peak / files:.0f} bytes a file at the peak"


def _shard_digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.tfrecord"))}


def test_a_tree_given_as_dot_or_by_its_full_path_gives_the_same_shards(image_tree_factory, tmp_path, monkeypatch):
    root = image_tree_factory(classes=2, per_class=5)
    convert_tree(ConvertOptions(root, tmp_path / "by-path", shards=2, workers=1))
    monkeypatch.chdir(root)  # "." lists its files without a "./" before their names
    report = convert_tree(ConvertOptions(".", tmp_path / "by-dot", shards=2, workers=2))

    assert report.examples == 10
    assert _shard_digests(tmp_path / "by-dot") == _shard_digests(tmp_path / "by-path")
