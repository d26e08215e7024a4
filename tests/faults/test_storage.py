"""Storage that dies or never answers: the storage emulator killed with -9, an s3:// store that accepts
connections and never answers, a FUSE mount whose server dies mid-train."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time

import pytest

from stallscope.storage.emulator import state_dirs
from stallscope.storage.emulator import emulate

from ..storage.conftest import BUCKET, s3_environment
from .harness import snapshot

LIMIT_S = 120  # every store started here stops itself after this
START_S = 120  # TF's import and the first steps, on a loaded machine


@pytest.mark.timeout(LIMIT_S * 2)
def test_storage_serve_killed_leaves_a_folder_the_next_store_removes(faults, tiny_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    ready = tmp_path / "ready.json"
    run = faults.launch("storage serve killed -9", ["storage", "serve", tiny_tree, "--gcs", "--for", "60s",
                                                    "--ready-file", ready], env={"TMPDIR": str(tmp_path)})
    run.wait_for(ready.exists, LIMIT_S, "ready file")
    left = [p for p in tmp_path.iterdir() if p.name.startswith(state_dirs.PREFIX)]
    assert len(left) == 1
    run.send(signal.SIGKILL)
    run.finish(LIMIT_S).check(rc=-signal.SIGKILL, within_s=10, stderr_lines=0)
    assert left[0].exists()  # -9: nothing ran to remove it
    with emulate(tiny_tree, kind="gcs", max_duration_s=LIMIT_S) as store:
        assert not left[0].exists()
        assert store.url.startswith("gs://")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(state_dirs.PREFIX)]


@pytest.mark.timeout(120)
def test_an_s3_store_that_never_answers_fails_in_one_line_within_the_timeout(faults, silent_port):
    env = s3_environment({"key": "key", "secret": "secret", "endpoint": f"http://127.0.0.1:{silent_port}"})
    outcome = faults.run("convert from a silent s3:// store", [
        "convert", f"s3://{BUCKET}/tree", "--output_path", "unused", "--storage-timeout", "2"], 90, env=env)
    outcome.check(rc=2, within_s=30)  # start-up and one 2 s deadline, not botocore's retries of each
    assert "did not answer" in outcome.stderr


@pytest.mark.timeout(300)
def test_train_on_a_mount_whose_server_dies_mid_run_is_one_line_naming_the_file(faults, tiny_tree, tmp_path):
    """A FUSE mount whose daemon is gone answers every call with ENOTCONN, which TF raised as a 30-line
    FailedPreconditionError traceback (exit 1); a read in flight as it dies fails with ECONNABORTED, which
    TF raises as an InternalError: a 29-line traceback (exit 1) until the line named it too."""
    from stallscope.storage.emulator.fuse_mount import why_no_fuse

    if why := why_no_fuse():
        pytest.skip(f"needs a FUSE mount (/dev/fuse, fuse3, mfusepy): {why}")
    before = snapshot(tiny_tree)
    mount = tmp_path / "mnt"
    mount.mkdir()
    try:
        with emulate(tiny_tree, kind="mount", mount_point=mount, latency_s=0.002, max_duration_s=LIMIT_S) as store:
            run = faults.launch("train on a FUSE mount whose server dies", [
                "train", "--dataset_path", mount, "--accelerator", "emulated:1ms", "--steps", "5000",
                "--pipeline", "seed", "--image_size", "32", "--batch_size", "4", "--shuffle-buffer", "8",
                "--log_path", tmp_path / "run"])
            run.wait_for(lambda: "step 10 " in run.stdout_so_far(), START_S, "'step 10' line")
            os.kill(store.pid, signal.SIGKILL)  # the server is gone, the mount left behind
            store.process.wait(30)
            run.stopped_at = time.monotonic()  # the time to fail counts from the server's death
            outcome = run.finish(120)
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True, timeout=30)
    outcome.check(rc=2, within_s=60)
    line = outcome.stderr_lines[0]
    assert line.startswith(f"stallscope train: error: {mount}/class_0") and "the mount's server is gone (" in line, line
    assert "Transport endpoint is not connected" in line or "Software caused connection abort" in line, line
    assert snapshot(tiny_tree) == before
