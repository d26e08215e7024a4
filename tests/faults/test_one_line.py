"""Mistakes and damage that ended in a traceback or a misleading line: each is now one line on stderr,
exit code 2 (docs/reference/errors.md), naming the file or flag and what was expected."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess

import pytest

from ..storage.conftest import BUCKET, s3_environment

TRAIN = ["--accelerator", "emulated:1ms", "--steps", "12", "--image_size", "32", "--batch_size", "4",
         "--pipeline", "seed"]
LIMIT_S = 180  # TF's import and a first batch, on a loaded machine


def _copy(tree, tmp_path, name="tree"):
    copy = tmp_path / name
    shutil.copytree(tree, copy)
    return copy


def _free_port() -> int:
    """A loopback port with nothing listening on it (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(LIMIT_S * 2)
def test_a_pipeline_config_that_is_not_text_is_one_line(faults, tiny_tree, tmp_path):
    binary = tmp_path / "program"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    outcome = faults.run("train --pipeline-config on a binary file", [
        "train", "--dataset_path", tiny_tree, "--pipeline-config", binary, "--log_path", tmp_path / "run",
        "--steps", "2"], LIMIT_S)
    outcome.check(rc=2, within_s=LIMIT_S)
    line = outcome.stderr_lines[0]
    assert f"--pipeline-config: {str(binary)!r}" in line and "not UTF-8 text" in line and "JSON" in line, line


@pytest.mark.timeout(LIMIT_S)
def test_a_pipeline_config_that_is_a_device_is_not_called_a_directory(faults, tiny_tree, tmp_path):
    outcome = faults.run("diagnose --pipeline-config /dev/zero", [
        "diagnose", "--dataset_path", tiny_tree, "--pipeline-config", "/dev/zero"], LIMIT_S)
    outcome.check(rc=2, within_s=LIMIT_S)
    line = outcome.stderr_lines[0]
    assert "--pipeline-config" in line and "/dev/zero" in line and "a character device" in line, line
    assert "directory" not in line, line


@pytest.mark.timeout(LIMIT_S * 2)
def test_diagnose_on_a_tree_with_an_empty_jpeg_names_the_file(faults, tiny_tree, tmp_path):
    tree = _copy(tiny_tree, tmp_path)
    empty = sorted(tree.rglob("*.jpg"))[4]
    empty.write_bytes(b"")
    outcome = faults.run("diagnose on a tree with a zero-byte JPEG", [
        "diagnose", "--dataset_path", tree, "--accelerator", "emulated:1ms", "--image_size", "32",
        "--batch_size", "4", "--work-dir", tmp_path / "work"], LIMIT_S * 2)
    outcome.check(rc=2, within_s=LIMIT_S * 2)
    line = outcome.stderr_lines[0]
    assert f"{empty}: TensorFlow cannot decode this image" in line, line


@pytest.mark.timeout(LIMIT_S * 2)
def test_the_search_for_the_bad_image_survives_a_file_name_that_is_not_utf8(faults, tiny_tree, tmp_path):
    """A name of bytes that are not UTF-8 (a\\xff.jpg) made the search for the undecodable image crash
    on its own (`ValueError: Error converting unicode string`, 87 lines)."""
    tree = _copy(tiny_tree, tmp_path)
    folder = sorted(p for p in tree.iterdir() if p.is_dir())[-1]
    first = sorted(folder.glob("*.jpg"))[0]
    os.rename(bytes(first), os.path.join(os.fsencode(folder), b"a\xff.jpg"))  # listed before the empty one
    empty = sorted(folder.glob("img_*.jpg"))[2]
    empty.write_bytes(b"")
    outcome = faults.run("train on a tree with a non-UTF-8 name and a zero-byte JPEG", [
        "train", "--dataset_path", tree, "--log_path", tmp_path / "run", *TRAIN], LIMIT_S * 2)
    outcome.check(rc=2, within_s=LIMIT_S * 2)
    assert f"{empty}: TensorFlow cannot decode this image" in outcome.stderr_lines[0], outcome.stderr


@pytest.mark.timeout(LIMIT_S)
def test_a_store_that_refuses_connections_says_so_not_that_it_did_not_answer(faults, tmp_path):
    port = _free_port()
    env = s3_environment({"key": "key", "secret": "secret", "endpoint": f"http://127.0.0.1:{port}"})
    outcome = faults.run("s3:// store that refuses connections", [
        "storage", "probe", f"s3://{BUCKET}/tree", "--storage-timeout", "5"], LIMIT_S, env=env)
    outcome.check(rc=2, within_s=LIMIT_S)
    line = outcome.stderr_lines[0]
    assert f"s3://{BUCKET}/tree" in line and f"127.0.0.1:{port}" in line and "refused the connection" in line, line
    assert "did not answer" not in line and "--storage-timeout" not in line, line


def _wait_until_stale(mount, limit_s: float = 60.0) -> None:
    """Until a stat of `mount` fails with ENOTCONN: the kernel answers it from its cache for a while
    after the daemon died."""
    import errno
    import time

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            os.stat(mount)
        except OSError as exc:
            assert exc.errno == errno.ENOTCONN, exc
            return
        time.sleep(0.1)
    raise AssertionError(f"{mount} still answered a stat {limit_s:g} s after its daemon was killed")


def _needs_fuse():
    from stallscope.storage.emulator.fuse_mount import why_no_fuse

    if why := why_no_fuse():
        pytest.skip(f"needs a FUSE mount (/dev/fuse, fuse3, mfusepy): {why}")


@pytest.mark.timeout(LIMIT_S * 2)
def test_serving_onto_a_stale_mount_names_the_command_that_clears_it(faults, tiny_tree, tmp_path):
    """A mount whose daemon was killed -9 stays behind, answering ENOTCONN: the next `storage serve
    --mount` there says how to clear it."""
    _needs_fuse()
    mount = tmp_path / "mnt"
    mount.mkdir()
    ready = tmp_path / "ready.json"
    try:
        first = faults.launch("storage serve --mount, killed -9", [
            "storage", "serve", tiny_tree, "--mount", mount, "--for", "120s", "--ready-file", ready])
        first.wait_for(ready.exists, LIMIT_S, "ready file")
        first.send(signal.SIGKILL)
        first.finish(LIMIT_S).check(rc=-signal.SIGKILL, within_s=30, stderr_lines=None)
        _wait_until_stale(mount)
        outcome = faults.run("storage serve --mount onto a stale mount", [
            "storage", "serve", tiny_tree, "--mount", mount, "--for", "5s"], LIMIT_S)
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True, timeout=30)
    outcome.check(rc=2, within_s=LIMIT_S)
    line = outcome.stderr_lines[0]
    assert f"--mount: {str(mount)!r}" in line and f"fusermount3 -u {mount}" in line, line


@pytest.mark.timeout(LIMIT_S)
def test_serve_mount_writes_its_files_where_it_was_started_and_prints_no_libfuse_line(faults, tiny_tree,
                                                                                       tmp_path):
    """libfuse changes the process's folder to /: relative --ready-file and --counters landed in /, and
    its first line was libfuse's "Ignoring invalid max threads value 4294967295 > max (100000)"."""
    _needs_fuse()
    (tmp_path / "mnt").mkdir()
    try:
        run = faults.launch("storage serve --mount with relative paths", [
            "storage", "serve", tiny_tree, "--mount", "mnt", "--ready-file", "rdy.json", "--counters", "c.json",
            "--for", "120s"], cwd=tmp_path)
        run.wait_for((tmp_path / "rdy.json").exists, LIMIT_S, "rdy.json in the folder it was started in")
        assert (tmp_path / "c.json").exists()
        assert f"mounted read-only at {tmp_path / 'mnt'} " in run.stdout_so_far()
        run.send(signal.SIGTERM)
        outcome = run.finish(LIMIT_S)
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(tmp_path / "mnt")], capture_output=True, timeout=30)
    outcome.check(rc=0, within_s=60)
    assert outcome.stderr_lines[0].startswith("# stopped:"), outcome.stderr


@pytest.mark.timeout(LIMIT_S)
def test_evaluate_on_other_labels_shows_the_difference_not_two_identical_lists(faults, tmp_path):
    """Records of 20 classes against a 10-class checkpoint printed the first five labels of each: the
    same five twice."""
    from stallscope.workload.models import ModelSpec

    from ..conftest import make_image_tree

    tree = make_image_tree(tmp_path / "tree", classes=20, per_class=1, size=(16, 16))
    labels = tuple(f"class_{c:02d}" for c in range(10))
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    ModelSpec(model="mobilenet", alpha=0.25, image_size=32, num_classes=10, labels=labels).save(checkpoints)
    (checkpoints / "ckpt-1.index").write_bytes(b"")  # listed, never read: the labels are compared first
    outcome = faults.run("evaluate on 20 classes with a 10-class checkpoint", [
        "evaluate", "--checkpoint_path", checkpoints, "--dataset_path", tree, "--split", "train"], LIMIT_S)
    outcome.check(rc=2, within_s=LIMIT_S)
    line = outcome.stderr_lines[0]
    assert "20 labels in the data, 10 in the checkpoint" in line, line
    assert "only in the data: class_10, class_11, class_12, class_13, class_14 and 5 more" in line, line
