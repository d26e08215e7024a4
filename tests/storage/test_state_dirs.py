"""A storage emulator killed with -9 leaves its state folder in the temporary folder; the next store
started removes it, and nothing that is not a dead run's marked folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from stallscope.storage import state_dirs
from stallscope.storage.emulator import emulate

from .conftest import child_environment

LIMIT_S = 60


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(LIMIT_S)
    return child.pid


def test_only_marked_folders_of_dead_makers_are_removed(tmp_path):
    dead = tmp_path / f"{state_dirs.PREFIX}dead"
    dead.mkdir()
    (dead / state_dirs.MARKER).write_text(json.dumps({"pid": _dead_pid(), "started": 0.0}))
    (dead / "serve.log").write_text("...")
    reused = tmp_path / f"{state_dirs.PREFIX}reused"  # our own PID, but another process's start time
    reused.mkdir()
    (reused / state_dirs.MARKER).write_text(json.dumps({"pid": os.getpid(), "started": 1.0}))
    live = tmp_path / f"{state_dirs.PREFIX}live"
    live.mkdir()
    (live / state_dirs.MARKER).write_text(json.dumps({"pid": os.getpid(),
                                                      "started": psutil.Process().create_time()}))
    unmarked = tmp_path / f"{state_dirs.PREFIX}someone-elses"
    unmarked.mkdir()
    other = tmp_path / "other-folder"
    other.mkdir()
    (other / state_dirs.MARKER).write_text(json.dumps({"pid": _dead_pid()}))
    assert sorted(state_dirs.clear_dead_state_dirs(tmp_path)) == sorted([dead, reused])
    assert not dead.exists() and not reused.exists()
    assert live.exists() and unmarked.exists() and other.exists()


@pytest.mark.timeout(LIMIT_S * 2)
def test_a_store_killed_with_sigkill_leaves_a_folder_the_next_store_removes(tiny_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(state_dirs.tempfile, "tempdir", None)  # TMPDIR is read again
    ready = tmp_path / "ready.json"
    server = subprocess.Popen([sys.executable, "-m", "stallscope", "storage", "serve", str(tiny_tree), "--gcs",
                               "--for", "60s", "--ready-file", str(ready)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=child_environment({"TMPDIR": str(tmp_path)}))
    try:
        deadline = time.monotonic() + LIMIT_S
        while not ready.exists() and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), "the store did not start"
        left = [p for p in tmp_path.iterdir() if p.name.startswith(state_dirs.PREFIX)]
        assert len(left) == 1
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(LIMIT_S)
    assert left[0].exists()  # -9: nothing ran to remove it
    with emulate(tiny_tree, kind="gcs", max_duration_s=LIMIT_S) as store:
        assert not left[0].exists()
        assert store.url.startswith("gs://")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(state_dirs.PREFIX)]
