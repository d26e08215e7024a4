"""`convert --runner beam` on Beam's local runner: the same shards, byte for byte, and the same manifest
as the local convert; bad options are one line; a killed run leaves nothing that looks complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("apache_beam", reason="Apache Beam is not installed (the `beam` extra, which `test` pulls in)")

from stallscope.cli.main import main  # noqa: E402
from stallscope.records.completeness import STATE_DIR, unfinished_conversion  # noqa: E402
from stallscope.records.convert import ConvertOptions, convert_tree  # noqa: E402
from stallscope.records.writer import frame_record  # noqa: E402


def _cli(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as exc:
        return int(exc.code)


def _manifest(out: Path) -> dict:
    data = json.loads((out / "manifest.json").read_text())
    del data["options"]["output_path"]
    return data


def _assert_same_output(ours: Path, reference: Path) -> None:
    names = sorted(p.name for p in reference.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == names  # no state folder, no temporaries
    for name in names:
        if name != "manifest.json":
            assert (ours / name).read_bytes() == (reference / name).read_bytes(), name
    assert _manifest(ours) == _manifest(reference)


def test_beam_writes_the_local_converts_bytes_and_manifest(messy_tree, tmp_path, capsys):
    """Bad files (truncated JPEG, text, a decompression bomb) are skipped with the same reasons and
    repairs (PNG, CMYK, rotated, downscaled) done in the workers give the same bytes."""
    src = messy_tree["root"]
    reference = tmp_path / "local"
    convert_tree(ConvertOptions(src, reference, shards=3, max_side=200))
    out = tmp_path / "beam"
    rc = _cli("convert", str(src), "--output_path", str(out), "--shards", "3", "--max-side", "200",
              "--runner", "beam", "--beam-option", "--direct_running_mode=in_memory")
    assert rc == 0, capsys.readouterr().err
    assert "converted 24 images into 6 shards" in capsys.readouterr().out
    _assert_same_output(out, reference)
    manifest = _manifest(out)
    reasons = {e["path"]: e["reason"] for e in manifest["skipped"]}
    assert reasons["train/dog/truncated.jpg"] == "truncated or corrupt image"
    assert reasons["train/dog/notes.jpg"] == "not an image"
    repaired = {e["path"] for e in manifest["repaired"]}
    assert {"train/cat/png_named.jpg", "train/cat/cmyk.jpg", "train/dog/big.jpg"} <= repaired


def test_options_file_and_size_cut(image_tree_factory, tmp_path):
    src = image_tree_factory(classes=2, per_class=5, splits=("train", "validation"))
    reference = tmp_path / "local"
    convert_tree(ConvertOptions(src, reference, size_per_record=6000, seed=7))
    options_file = tmp_path / "beam.options"
    options_file.write_text("# local runner, one worker\n--runner=FnApiRunner\n--direct_num_workers=1\n")
    out = tmp_path / "beam"
    assert _cli("convert", str(src), "--output_path", str(out), "--size_per_record", "6000", "--seed", "7",
                "--runner", "beam", "--beam-options-file", str(options_file)) == 0
    _assert_same_output(out, reference)


@pytest.mark.parametrize("extra, needle", [
    (["--runner", "beam", "--beam-option", "--num_workerz=4"], "'--num_workerz=4'"),
    (["--runner", "beam", "--beam-option", "--num_workers=many"], "--num_workers: invalid int value"),
    (["--runner", "beam", "--beam-option", "--runner=NoSuchRunner"], "'NoSuchRunner'"),
    (["--runner", "beam", "--beam-options-file", "{tmp}/bad.options"], "bad.options: expected an Apache Beam"),
    (["--runner", "beam", "--beam-options-file", "{tmp}/quote.options"], "quote.options: expected Beam options as on a command line"),
    (["--runner", "beam", "--beam-options-file", "{tmp}/none.options"], "--beam-options-file"),
    (["--runner", "beam", "--workers", "2"], "--workers"),
    (["--runner", "beam", "--beam-option", "--runner=DataflowRunner"], "expected a bucket path"),
    (["--beam-option", "--num_workers=4"], "--beam-option: applies to --runner beam"),
    (["--runner", "spark"], "--runner"),
])
def test_bad_beam_options_are_one_line_exit_2(extra, needle, tiny_tree, tmp_path, capsys):
    (tmp_path / "bad.options").write_text("--runner=FnApiRunner\n--no_such_option=1\n")
    (tmp_path / "quote.options").write_text("--job_name='unclosed\n")
    out = tmp_path / "out"
    argv = ["convert", str(tiny_tree), "--output_path", str(out)] + [a.format(tmp=tmp_path) for a in extra]
    rc = _cli(*argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not out.exists()  # refused before the output folder was touched


def _noisy_tree(root: Path, per_class: int = 24) -> Path:
    """Noisy 480x360 JPEGs: a one-worker conversion of these takes long enough to be killed mid-way."""
    rng = np.random.default_rng(5)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (360, 480, 3), dtype=np.uint8)).save(root / label / f"{i:03d}.jpg", quality=90)
    return root


def _beam_cli(src: Path, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "stallscope", "convert", str(src), "--output_path", str(out), "--shards", "16",
           "--runner", "beam", "--beam-option", "--direct_num_workers=1"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True, env=env)


def test_killed_beam_run_looks_unfinished_and_a_rerun_finishes_it(tmp_path):
    src = _noisy_tree(tmp_path / "src")
    out = tmp_path / "out"
    child = _beam_cli(src, out)
    deadline = time.monotonic() + 120
    while not list(out.glob("*.tfrecord")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL, "the conversion finished before it could be killed"
    assert 1 <= len(list(out.glob("*.tfrecord"))) < 16
    assert not (out / "manifest.json").exists() and (out / STATE_DIR).is_dir()
    assert "unfinished conversion" in unfinished_conversion(out)

    rerun = _beam_cli(src, out)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr
    assert "complete shard(s) from an interrupted run" in stdout
    reference = tmp_path / "local"
    convert_tree(ConvertOptions(src, reference, shards=16))
    _assert_same_output(out, reference)


def test_progress_counts_the_shards_workers_finish(tmp_path, monkeypatch):
    """The launcher's progress comes from the state files the workers save, whatever the runner: a new
    state counts its shard's images as soon as it appears; one left by an earlier run only at the end."""
    from stallscope.records import beam_convert
    from stallscope.records.convert import PlannedShard

    monkeypatch.setattr(beam_convert, "PROGRESS_POLL_S", 0.02)
    state_dir = tmp_path / "state"
    (state_dir / beam_convert.PLAN_DIR).mkdir(parents=True)
    shards = [PlannedShard("train", f"train-{i:05d}-of-00003.tfrecord", tuple(range(n)), "f") for i, n in enumerate((5, 7, 4))]
    (state_dir / f"{shards[2].filename}.json").write_text("{}")  # an earlier run's state: not news
    (state_dir / beam_convert.PLAN_DIR / f"{shards[1].filename}.json").write_text("{}")  # an item list, not a state
    calls: list[tuple[int, int]] = []

    def wait_for(done: int) -> None:
        deadline = time.monotonic() + 10
        while (not calls or calls[-1][0] != done) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls and calls[-1] == (done, 30), calls

    with beam_convert.watching_shards(state_dir, shards, 14, 30, lambda done, total: calls.append((done, total))):
        time.sleep(0.1)
        assert calls == []  # nothing new yet: no report
        (state_dir / f"{shards[1].filename}.json").write_text("{}")
        wait_for(14 + 7)
        (state_dir / f"{shards[0].filename}.json").write_text("{}")
        wait_for(14 + 7 + 5)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_beam_convert_reports_progress_to_the_last_image(image_tree_factory, tmp_path, monkeypatch):
    from stallscope.records import beam_convert

    monkeypatch.setattr(beam_convert, "PROGRESS_POLL_S", 0.05)
    src = image_tree_factory(classes=2, per_class=6)
    calls: list[tuple[int, int]] = []
    report = beam_convert.convert_with_beam(ConvertOptions(src, tmp_path / "out", shards=4),
                                            ("--runner=FnApiRunner", "--direct_num_workers=1"),
                                            progress=lambda done, total: calls.append((done, total)))
    assert report.examples == 12
    assert calls[0] == (0, 12) and calls[-1] == (12, 12)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
