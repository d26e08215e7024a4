"""A conversion killed by SIGKILL mid-way and run again ends byte-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
from PIL import Image

from stallscope.records.convert import ConvertOptions, convert_tree


def _tree(root, n_per_class=24):
    """Large enough noisy JPEGs that a conversion with workers=1 takes a few hundred milliseconds."""
    rng = np.random.default_rng(3)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(n_per_class):
            pixels = rng.integers(0, 256, (360, 480, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i:03d}.jpg", quality=90)
    return root


def _convert_cli(src, out):
    cmd = [sys.executable, "-m", "stallscope", "convert", str(src), "--output_path", str(out),
           "--shards", "16", "--workers", "1", "--no-progress"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True)


def test_kill_after_first_shard_then_rerun(tmp_path):
    src = _tree(tmp_path / "src")
    reference = tmp_path / "reference"
    convert_tree(ConvertOptions(src, reference, shards=16, workers=2))

    out = tmp_path / "out"
    child = _convert_cli(src, out)
    deadline = time.monotonic() + 120
    while not list(out.glob("*.tfrecord")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL, "the conversion finished before it could be killed"
    written = sorted(p.name for p in out.glob("*.tfrecord"))
    assert 1 <= len(written) < 16 and not (out / "manifest.json").exists()

    rerun = _convert_cli(src, out)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr
    assert "kept" in stdout and "complete shard(s) from an interrupted run" in stdout

    names = sorted(p.name for p in reference.glob("*.tfrecord"))
    assert sorted(p.name for p in out.glob("*.tfrecord")) == names and len(names) == 16
    for name in names:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    ours, theirs = (json.loads((d / "manifest.json").read_text()) for d in (out, reference))
    for manifest in (ours, theirs):
        del manifest["options"]["output_path"], manifest["options"]["workers"]
    assert ours == theirs
    assert sorted(p.name for p in out.iterdir()) == sorted(names + ["labels.txt", "manifest.json"])


def test_ctrl_c_mid_conversion_leaves_a_set_verify_and_train_refuse(tmp_path):
    """Ctrl-C (SIGINT to the process group) after the first shard: exit 130 in one line, and the shards
    left behind are an error for `verify` and for the training source, naming the command to finish."""
    import pytest

    from stallscope.errors import DataError
    from stallscope.pipeline.sources import open_source

    src = _tree(tmp_path / "src")
    out = tmp_path / "out"
    child = _convert_cli(src, out)
    deadline = time.monotonic() + 120
    while not list(out.glob("*.tfrecord")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(child.pid, signal.SIGINT)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 130, "the conversion finished before it could be interrupted"
    assert stderr.strip() == "stallscope convert: interrupted"
    assert 1 <= len(list(out.glob("*-of-00016.tfrecord"))) < 16 and not (out / "manifest.json").exists()

    verify = subprocess.run([sys.executable, "-m", "stallscope", "verify", str(out), "--no-decode"],
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 1 and "unfinished conversion" in verify.stdout, verify.stdout
    assert f"--output_path {out.resolve()} --shards 16` again to finish it" in verify.stdout
    with pytest.raises(DataError, match="unfinished conversion"):
        open_source("records", out)
