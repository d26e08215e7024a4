"""Links in the tree that lead out of it are not read for content (a `passwd.jpg -> /etc/passwd` put the
file's first bytes in the manifest), and a linked state folder is refused (66 state files went elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stallscope.errors import UsageError
from stallscope.records.completeness import STATE_DIR
from stallscope.records.convert import LINK_OUT_OF_TREE, ConvertOptions, convert_tree, format_summary
from stallscope.records.manifest import load_manifest

from ..conftest import jpeg_bytes

SECRET = b"root:x:0:0:the secret first bytes of a file outside the tree\n"


@pytest.fixture
def linked_tree(image_tree_factory, tmp_path):
    """Two classes of 3 JPEGs, plus a link to a secret file outside, a link to a JPEG outside, and a link to
    a JPEG of the tree itself."""
    import numpy as np

    tree = image_tree_factory(classes=2, per_class=3)
    (tmp_path / "passwd").write_bytes(SECRET)
    (tmp_path / "outside.jpg").write_bytes(jpeg_bytes(np.random.default_rng(7)))
    os.symlink(tmp_path / "passwd", tree / "class_00" / "passwd.jpg")
    os.symlink(tmp_path / "outside.jpg", tree / "class_00" / "outside.jpg")
    os.symlink(os.path.join("..", "class_00", "img_000.jpg"), tree / "class_01" / "inside.jpg")
    return tree


def test_links_out_of_the_tree_are_skipped_unread(linked_tree, tmp_path):
    out = tmp_path / "out"
    report = convert_tree(ConvertOptions(linked_tree, out, shards=1, workers=1))
    manifest = load_manifest(out)
    skipped = {e["path"]: e for e in manifest.skipped}
    assert skipped["class_00/passwd.jpg"] == {"path": "class_00/passwd.jpg", "reason": LINK_OUT_OF_TREE}
    assert skipped["class_00/outside.jpg"]["reason"] == LINK_OUT_OF_TREE
    assert "class_01/inside.jpg" not in skipped and report.examples == 7  # a link inside the tree is read
    text = (out / "manifest.json").read_text()
    assert "root:x" not in text and "secret" not in text
    assert f"  skipped 2 file(s): 2 {LINK_OUT_OF_TREE}" in format_summary(report)


def test_follow_links_reads_them(linked_tree, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "stallscope", "convert", str(linked_tree), "--output_path", str(out),
                             "--shards", "1", "--workers", "1", "--no-progress", "--follow-links"],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["examples"] == 8 and manifest["options"]["follow_links"] is True
    assert [e["path"] for e in manifest["skipped"]] == ["class_00/passwd.jpg"]  # read, and not an image


def test_a_linked_state_folder_is_refused(tiny_tree, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / STATE_DIR).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UsageError, match=rf"--output_path: '{out / STATE_DIR}' is a symlink; expected") as caught:
        convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1))
    assert "\n" not in str(caught.value)
    assert list(elsewhere.iterdir()) == [] and not list(out.glob("*.tfrecord"))


def test_the_links_prepare_made_to_its_source_are_followed(linked_tree, tmp_path):
    """`prepare imagenet-val --mode link` puts symbolic links to its source where it cannot hard-link
    (another file system), and says so in prepare.json: those are the data set's own files, converted
    without --follow-links; a link anywhere else is still skipped unread."""
    import numpy as np

    source = tmp_path / "ILSVRC2012_img_val"
    source.mkdir()
    (source / "ILSVRC2012_val_00000001.JPEG").write_bytes(jpeg_bytes(np.random.default_rng(8)))
    os.symlink(source / "ILSVRC2012_val_00000001.JPEG", linked_tree / "class_01" / "ILSVRC2012_val_00000001.JPEG")
    (linked_tree / "prepare.json").write_text(json.dumps({"format": "stallscope-prepare", "kind": "imagenet-val",
                                                          "source": str(source), "mode": "link", "symlinked": 1}))
    out = tmp_path / "out"
    report = convert_tree(ConvertOptions(linked_tree, out, shards=1, workers=1))
    skipped = {e["path"]: e["reason"] for e in load_manifest(out).skipped}
    assert "class_01/ILSVRC2012_val_00000001.JPEG" not in skipped and report.examples == 8
    assert skipped["class_00/passwd.jpg"] == skipped["class_00/outside.jpg"] == LINK_OUT_OF_TREE
