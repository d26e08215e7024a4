"""The watch on TF's own file calls: a call on a network file system that does not come back within the
timeout is named with its file; a slow reader that moves on, and a wait on a local pipe, are not."""

from __future__ import annotations

import os
import threading
import time

import pytest

from stallscope.storage.emulator import emulate
from stallscope.storage.fuse_mount import why_no_fuse
from stallscope.storage.stuck_calls import StuckCallWatch

pytestmark = [
    pytest.mark.skipif(bool(why_no_fuse()), reason=f"needs a FUSE mount: {why_no_fuse()}"),
    pytest.mark.skipif(not StuckCallWatch.available(), reason="needs Linux's /proc/self/task/*/syscall"),
]
LIMIT_S = 60


def _watched(seconds: float, work) -> list:
    """Runs `work` on a thread under a 0.5 s watch for `seconds`; what the watch reported, each with the
    seconds from the start to its report."""
    reported = []
    started = time.monotonic()
    with StuckCallWatch(0.5, lambda stuck: reported.append((stuck, time.monotonic() - started)), interval_s=0.05):
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        deadline = time.monotonic() + seconds
        while not reported and time.monotonic() < deadline:
            time.sleep(0.05)
    thread.join(10)
    return reported


def test_a_read_the_server_does_not_answer_is_named_with_its_file(tmp_path):
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    (served / "shard.tfrecord").write_bytes(os.urandom(4096))
    # 1 KB/s: the one 4 KB read takes 4 s, far past the watch's 0.5 s
    with emulate(served, kind="mount", mount_point=mount, latency_s=0.0, bandwidth_bps=8_000, max_duration_s=LIMIT_S):
        fd = os.open(mount / "shard.tfrecord", os.O_RDONLY)
        try:
            reported = _watched(3.0, lambda: os.pread(fd, 4096, 0))
        finally:
            os.close(fd)
    assert len(reported) == 1
    stuck, after_s = reported[0]
    assert 0.5 <= after_s < 2.0  # the read itself takes 4 s
    assert stuck.call == "pread64" and stuck.path == str(mount.resolve() / "shard.tfrecord")
    assert stuck.fstype.startswith("fuse") and stuck.seconds >= 0.5
    assert stuck.doing == f"reading {str(mount.resolve() / 'shard.tfrecord')!r}"


def test_a_reader_that_moves_on_and_a_wait_on_a_local_pipe_are_not_stuck(tmp_path):
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    (served / "big").write_bytes(os.urandom(1 << 20))
    with emulate(served, kind="mount", mount_point=mount, latency_s=0.02, max_duration_s=LIMIT_S):
        fd = os.open(mount / "big", os.O_RDONLY | getattr(os, "O_DIRECT", 0))

        def read_on() -> None:  # 4 KB at a time for 1.5 s, each read 20 ms: slow, never stuck
            ends = time.monotonic() + 1.5
            offset = 0
            while time.monotonic() < ends:
                os.pread(fd, 4096, offset)
                offset = (offset + 4096) % (1 << 20)

        try:
            assert _watched(2.0, read_on) == []
        finally:
            os.close(fd)
    reading, writing = os.pipe()
    threading.Timer(1.5, lambda: os.write(writing, b"x")).start()
    try:
        assert _watched(2.0, lambda: os.read(reading, 1)) == []  # a pipe is no network file system
    finally:
        os.close(reading)
        os.close(writing)
