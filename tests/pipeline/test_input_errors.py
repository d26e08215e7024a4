"""Damaged input met in the middle of `train`: one line naming the shard, record and byte, or the image."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from stallscope.records.convert import ConvertOptions, convert_tree
from stallscope.records.verify import read_frames

TRAIN = ["--accelerator", "emulated:1ms", "--steps", "12", "--image_size", "32", "--batch_size", "4",
         "--pipeline", "seed"]


def _train(*argv):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "stallscope", "train", *map(str, argv), *TRAIN],
                          capture_output=True, text=True, timeout=300, env=env)


def test_flipped_byte_in_a_shard_names_shard_record_and_offset(tiny_tree, tmp_path):
    records = tmp_path / "records"
    convert_tree(ConvertOptions(tiny_tree, records, shards=2, workers=1))
    shard = records / "train-00001-of-00002.tfrecord"
    data = bytearray(shard.read_bytes())
    target = list(read_frames(bytes(data)))[2]
    data[target.offset + 12 + len(target.payload) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = _train("--source", "records", "--dataset_path", records, "--log_path", tmp_path / "run")
    err = result.stderr.strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"{shard}: record 2 at byte {target.offset}: record data checksum mismatch" in err, err
    assert "stallscope verify" in err and "Traceback" not in err


def test_truncated_jpeg_names_the_file(tiny_tree, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(tiny_tree, tree)
    victim = sorted(tree.rglob("*.jpg"))[5]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 3])
    result = _train("--source", "files", "--dataset_path", tree, "--log_path", tmp_path / "run")
    err = result.stderr.strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"{victim}: TensorFlow cannot decode this image" in err and "Traceback" not in err, err


def test_an_image_deleted_after_the_listing_is_named_as_gone(tiny_tree, tmp_path):
    """A sync job deleting files under a running job: TF's NotFoundError names the image only inside a
    pipeline trace; the line names it with what was expected."""
    import tensorflow as tf

    from stallscope.errors import DataError
    from stallscope.pipeline.builder import build_dataset
    from stallscope.pipeline.input_errors import input_error
    from stallscope.pipeline.sources import open_source
    from stallscope.workload.evaluate import evaluation_pipeline

    tree = tmp_path / "tree"
    shutil.copytree(tiny_tree, tree)
    source = open_source("files", tree)  # the run's listing
    victim = sorted(tree.rglob("*.jpg"))[3]
    victim.unlink()
    dataset = build_dataset(evaluation_pipeline(image_size=32, batch_size=4), source, num_classes=source.num_classes)
    try:
        for _ in dataset:
            pass
    except tf.errors.NotFoundError as exc:
        error = input_error(source, exc)
    else:
        raise AssertionError("reading a deleted image raised no NotFoundError")
    assert isinstance(error, DataError) and str(error).startswith(f"{victim}: no longer there (listed when the run")
    assert "\n" not in str(error)


def test_a_mount_whose_server_dies_mid_run_is_one_line_naming_the_file(tiny_tree, tmp_path):
    """A FUSE mount whose daemon is gone answers every call with ENOTCONN, which TF raises as
    FailedPreconditionError ("Transport endpoint is not connected"): a 30-line traceback, exit 1."""
    import signal

    import pytest

    from stallscope.errors import StallscopeError
    from stallscope.pipeline.presets import get_preset
    from stallscope.pipeline.sources import open_source
    from stallscope.storage.emulator import emulate
    from stallscope.storage.emulator.fuse_mount import why_no_fuse
    from stallscope.workload.train import TrainOptions, run_training

    if why := why_no_fuse():
        pytest.skip(f"needs a FUSE mount (/dev/fuse, fuse3, mfusepy): {why}")
    mount = tmp_path / "mnt"
    mount.mkdir()
    try:
        with emulate(tiny_tree, kind="mount", mount_point=mount, latency_s=0.001, max_duration_s=120) as store:
            source = open_source("files", mount)  # listed while the mount's server answers
            os.kill(store.pid, signal.SIGKILL)  # then it is gone, the mount left behind
            store.process.wait(30)
            options = TrainOptions(source="files", dataset_path=mount, accelerator="emulated:1ms", steps=4,
                                   pipeline=get_preset("seed").replace(batch_size=4, image_size=32, shuffle_buffer=8),
                                   log_path=tmp_path / "run")
            with pytest.raises(StallscopeError) as caught:
                run_training(options, source=source)
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True, timeout=30)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(f"{mount.resolve()}/class_0") and ".jpg: " in line
    assert "the mount's server is gone" in line and "Transport endpoint is not connected" in line
