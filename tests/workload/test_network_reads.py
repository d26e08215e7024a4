"""Training from a network file system: TF's own reads there are watched, so a server that stops
answering ends `stallscope train` with one line naming the flag and the file, not a hang."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.fuse_mount import why_no_fuse
from stallscope.storage.stuck_calls import StuckCallWatch

from ..storage.conftest import child_environment
from .test_cli import TINY

pytestmark = [
    pytest.mark.skipif(bool(why_no_fuse()), reason=f"needs a FUSE mount: {why_no_fuse()}"),
    pytest.mark.skipif(not StuckCallWatch.available(), reason="needs Linux's /proc/self/task/*/syscall"),
]
LIMIT_S = 180


def _train(mount, run_dir, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallscope", "train", "--dataset_path", str(mount),
                           "--accelerator", "emulated:5ms", "--steps", "4", "--log_path", str(run_dir),
                           "--pipeline", "seed", *TINY, *extra],
                          capture_output=True, text=True, timeout=120, env=child_environment())


def test_training_reads_through_a_slow_mount_and_a_read_that_is_not_answered_is_one_line(tiny_tree, tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    with emulate(tiny_tree, kind="mount", mount_point=mount, latency_s=0.002, max_duration_s=LIMIT_S):
        done = _train(mount, tmp_path / "slow", "--storage-timeout", "0.5")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "slow" / "summary.json").is_file()
    # 1 KB/s: each image's one read takes a second or more; listing and opening stay quick
    with emulate(tiny_tree, kind="mount", mount_point=mount, latency_s=0.0, bandwidth_bps=8_000, max_duration_s=LIMIT_S):
        started = time.monotonic()
        done = _train(mount, tmp_path / "hung", "--storage-timeout", "0.5")
        elapsed = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(lines) == 1, done.stderr
    fstype = lines[0].split("(")[1].split(")")[0]
    assert fstype.startswith("fuse")
    assert lines[0].startswith(f"stallscope train: error: --dataset_path: the file system ({fstype}) reading "
                               f"'{mount.resolve()}/")
    assert lines[0].endswith(".jpg' did not answer for 0.5 s; expected it within --storage-timeout"), lines[0]
    assert not (tmp_path / "hung" / "summary.json").exists()  # a run cut short is never taken for complete
    assert elapsed < 60
