"""A storage emulator killed with -9 leaves its state folder in the temporary folder; the next store
started removes it, and nothing that is not a dead run's marked folder (the kill itself, from the
command line: tests/faults/test_storage.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

from stallscope.storage.emulator import state_dirs

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
