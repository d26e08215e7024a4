"""convert deletes only what its own records say it wrote, takes a lock, and an unfinished conversion
is an error for `verify` and for training, naming the command that finishes it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stallscope.errors import DataError, UsageError
from stallscope.pipeline.sources import open_source
from stallscope.records.completeness import STATE_DIR
from stallscope.records.convert import ConvertOptions, convert_tree
from stallscope.records.lock import LOCK_NAME, LockedError, exclusive_lock
from stallscope.records.manifest import load_manifest


def _cli(*argv):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "stallscope", *map(str, argv)], capture_output=True, text=True,
                          timeout=300, env=env)


def test_rerun_leaves_a_shard_named_file_it_never_wrote(tiny_tree, tmp_path):
    out = tmp_path / "out"
    convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1))
    other = out / "other-00000-of-00001.tfrecord"
    other.write_bytes(b"the user's own records")
    result = _cli("convert", tiny_tree, "--output_path", out, "--shards", "2", "--workers", "1", "--no-progress")
    assert result.returncode == 2, result.stderr
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "other-00000-of-00001.tfrecord" in err and "left alone" in err, err
    assert other.read_bytes() == b"the user's own records"
    assert (out / "manifest.json").exists(), "a refused run must not take the finished conversion apart"


def test_a_file_named_like_a_planned_shard_is_not_overwritten(tiny_tree, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mine = out / "train-00000-of-00002.tfrecord"
    mine.write_bytes(b"not written by convert")
    with pytest.raises(UsageError, match="train-00000-of-00002.tfrecord"):
        convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1))
    assert mine.read_bytes() == b"not written by convert"


def test_shards_of_a_finished_run_stay_ours_when_the_rerun_is_interrupted(tiny_tree, tmp_path):
    """The rerun removes the manifest first; its state must still vouch for the old shards."""
    out = tmp_path / "out"
    convert_tree(ConvertOptions(tiny_tree, out, shards=4, workers=1))

    def stop(done, total):
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1, replace=True), progress=stop)
    assert not (out / "manifest.json").exists()
    convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1))
    assert sorted(p.name for p in out.glob("*.tfrecord")) == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]


def _interrupted_conversion(tiny_tree, out, shards=8):
    """A real conversion stopped after its third shard, as Ctrl-C stops it (KeyboardInterrupt in the loop)."""
    per_shard = 24 // shards

    def interrupt(done, total):
        if done > 3 * per_shard:  # the fourth shard under way: three are complete
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_tree(ConvertOptions(tiny_tree, out, shards=shards, workers=1), progress=interrupt)
    assert len(list(out.glob("*-of-00008.tfrecord"))) == 3 and not (out / "manifest.json").exists()
    return out


def test_verify_and_train_refuse_an_interrupted_conversion(tiny_tree, tmp_path):
    out = _interrupted_conversion(tiny_tree, tmp_path / "out")
    result = _cli("verify", out, "--no-decode")
    assert result.returncode == 1, result.stdout
    assert "unfinished conversion" in result.stdout and "FAILED" in result.stdout
    assert f"stallscope convert {tiny_tree.resolve()} --output_path {out.resolve()} --shards 8" in result.stdout
    with pytest.raises(DataError, match="--shards 8` again to finish it"):
        open_source("records", out)
    # the state folder gone (copied elsewhere, say), the names still say -of-00008
    bare = tmp_path / "copy"
    bare.mkdir()
    for shard in out.glob("*.tfrecord"):
        (bare / shard.name).write_bytes(shard.read_bytes())
    result = _cli("verify", bare, "--no-decode")
    assert result.returncode == 1 and "3 of the 8 shards" in result.stdout, result.stdout
    with pytest.raises(DataError, match="3 of the 8 shards"):
        open_source("records", bare)


def test_finishing_the_conversion_makes_it_pass(tiny_tree, tmp_path):
    out = _interrupted_conversion(tiny_tree, tmp_path / "out")
    convert_tree(ConvertOptions(tiny_tree, out, shards=8, workers=1))
    assert not (out / STATE_DIR).exists()
    result = _cli("verify", out, "--no-decode")
    assert result.returncode == 0, result.stdout
    assert open_source("records", out).num_examples == 24


def test_a_second_convert_into_a_locked_folder_names_the_holder(tiny_tree, tmp_path):
    out = tmp_path / "out"
    (out / STATE_DIR).mkdir(parents=True)
    with exclusive_lock(out / STATE_DIR / LOCK_NAME, what="test"):
        result = _cli("convert", tiny_tree, "--output_path", out, "--workers", "1", "--no-progress")
    err = result.stderr.strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"PID {os.getpid()} on host" in err and "already running" in err, err
    assert not list(out.glob("*.tfrecord"))


def test_a_lock_left_by_a_killed_process_does_not_block(tiny_tree, tmp_path):
    out = tmp_path / "out"
    (out / STATE_DIR).mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, signal, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'PID x'); print('held', flush=True); signal.pause()",
         str(out / STATE_DIR / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LockedError, match="PID x"):
        convert_tree(ConvertOptions(tiny_tree, out, workers=1))
    holder.kill()
    holder.wait()
    assert convert_tree(ConvertOptions(tiny_tree, out, workers=1)).examples == 24


def test_unwritable_output_folder_is_one_line(tiny_tree, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = _cli("convert", tiny_tree, "--output_path", blocker / "out", "--workers", "1", "--no-progress")
    err = result.stderr.strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1, err
    assert "cannot write" in err and str(blocker / "out") in err


def _shards(out):
    return {p.name: p.read_bytes() for p in out.glob("*.tfrecord")}


def test_a_conversion_of_another_source_is_refused_unless_replaced(tiny_tree, image_tree_factory, tmp_path):
    """The 64 shards of an earlier source were deleted for 4 of another, with no word."""
    other = image_tree_factory(classes=2, per_class=3)
    out = tmp_path / "out"
    convert_tree(ConvertOptions(tiny_tree, out, shards=4, workers=1))
    before, manifest = _shards(out), (out / "manifest.json").read_text()
    result = _cli("convert", other, "--output_path", out, "--shards", "4", "--workers", "1", "--no-progress")
    err = result.stderr.strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"--output_path: {str(out)!r} holds a finished conversion (4 shard(s), 24 images)" in err, err
    assert f"source {str(other.resolve())!r} (was {str(tiny_tree.resolve())!r})" in err and "--replace" in err, err
    assert _shards(out) == before and (out / "manifest.json").read_text() == manifest
    result = _cli("convert", other, "--output_path", out, "--shards", "4", "--workers", "1", "--no-progress",
                  "--replace")
    assert result.returncode == 0, result.stderr
    assert sum(load_manifest(out).splits[s].examples for s in load_manifest(out).splits) == 6


def test_another_shard_plan_is_refused_and_the_same_one_repeats(tiny_tree, tmp_path):
    """`convert --output_path rec5m` into an earlier 5 MB-shard output replaced it with one shard, silently."""
    out = tmp_path / "rec5m"
    convert_tree(ConvertOptions(tiny_tree, out, size_per_record=5_000, workers=1))
    before = _shards(out)
    assert len(before) > 1
    with pytest.raises(UsageError, match=r"size-per-record 52428800 \(was 5000\)"):
        convert_tree(ConvertOptions(tiny_tree, out, workers=1))
    with pytest.raises(UsageError, match=r"size-per-record unset \(was 5000\); shards 2 \(was unset\)"):
        convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1))
    assert _shards(out) == before
    convert_tree(ConvertOptions(tiny_tree, out, size_per_record=5_000, workers=2))  # workers decide nothing
    assert _shards(out) == before, "the same conversion repeated, to the same bytes"


def test_an_unfinished_conversion_of_another_plan_is_refused_and_its_own_finishes(tiny_tree, tmp_path):
    out = _interrupted_conversion(tiny_tree, tmp_path / "out")
    kept = _shards(out)
    with pytest.raises(UsageError, match=r"unfinished conversion of another source or plan \(`stallscope convert .*"
                                         r"--shards 8` finishes it\)"):
        convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1))
    assert _shards(out) == kept
    assert convert_tree(ConvertOptions(tiny_tree, out, shards=8, workers=1)).reused_shards == 3
