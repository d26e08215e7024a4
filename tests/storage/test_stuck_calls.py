"""The watch on TF's own file calls: a call on a network file system that does not come back within the
timeout is named with its file; a slow reader that moves on, and a wait on a local pipe, are not."""

from __future__ import annotations

import os
import threading
import time

import pytest

from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.fuse_mount import why_no_fuse
from stallscope.storage.stuck_calls import StuckCallWatch, nfs_replies

pytestmark = [
    pytest.mark.skipif(bool(why_no_fuse()), reason=f"needs a FUSE mount: {why_no_fuse()}"),
    pytest.mark.skipif(not StuckCallWatch.available(), reason="needs Linux's /proc/self/task/*/syscall"),
]
LIMIT_S = 60


def _watched(seconds: float, work, **options) -> list:
    """Runs `work` on a thread under a 0.5 s watch for `seconds`; what the watch reported, each with the
    seconds from the start to its report."""
    reported = []
    started = time.monotonic()
    with StuckCallWatch(0.5, lambda stuck: reported.append((stuck, time.monotonic() - started)), interval_s=0.05,
                        **options):
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


def test_a_call_waiting_on_a_server_that_goes_on_answering_is_slow_not_stuck(tmp_path):
    """As on NFS, whose answers /proc/self/mountstats counts: a call that waits past the timeout while the
    mount's server keeps answering (a close flushing a large file) is not reported; once the answers stop
    for the timeout, it is."""
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    (served / "big.tfrecord").write_bytes(os.urandom(4096))
    (served / "other.tfrecord").write_bytes(os.urandom(4096))  # not in the page cache when read
    answers = [0]
    with emulate(served, kind="mount", mount_point=mount, latency_s=0.0, bandwidth_bps=8_000, max_duration_s=LIMIT_S):
        def answering() -> dict[str, int]:
            answers[0] += 1
            return {str(mount.resolve()): answers[0]}

        fd, other = os.open(mount / "big.tfrecord", os.O_RDONLY), os.open(mount / "other.tfrecord", os.O_RDONLY)
        try:
            assert _watched(2.5, lambda: os.pread(fd, 4096, 0), replies=answering) == []  # the read takes 4 s
            stuck = _watched(3.0, lambda: os.pread(other, 4096, 0), replies=lambda: {str(mount.resolve()): 7})
        finally:
            os.close(fd)
            os.close(other)
    assert len(stuck) == 1 and stuck[0][0].call == "pread64"


def test_an_open_the_server_does_not_answer_is_named_with_the_file_it_opens(tmp_path):
    """An open names its file by a path in the caller's memory, absolute or from a folder's descriptor;
    the watch reads it there, so the line names the file, not only the network folder."""
    served, mount = tmp_path / "served", tmp_path / "mnt"
    (served / "deep").mkdir(parents=True)
    mount.mkdir()
    (served / "deep" / "one.jpg").write_bytes(b"x")
    (served / "deep" / "two.jpg").write_bytes(b"x")
    # each open takes 1.5 s, past the watch's 0.5 s
    with emulate(served, kind="mount", mount_point=mount, latency_s=1.5, max_duration_s=LIMIT_S):
        folder = os.open(mount / "deep", os.O_RDONLY | os.O_DIRECTORY)
        try:
            opened = _watched(2.0, lambda: os.close(os.open(str(mount / "deep" / "one.jpg"), os.O_RDONLY)))
            from_folder = _watched(2.0, lambda: os.close(os.open("two.jpg", os.O_RDONLY, dir_fd=folder)))
        finally:
            os.close(folder)
    (stuck, _), = opened
    assert stuck.call in ("openat", "open") and stuck.file_known
    assert stuck.path == str(mount / "deep" / "one.jpg") and stuck.fstype.startswith("fuse")
    assert stuck.doing == f"opening {str(mount / 'deep' / 'one.jpg')!r}"
    (stuck, _), = from_folder
    assert stuck.call == "openat" and stuck.path == str(mount.resolve() / "deep" / "two.jpg")
    assert stuck.doing == f"opening {str(mount.resolve() / 'deep' / 'two.jpg')!r}"


MOUNTSTATS = """device proc mounted on /proc with fstype proc
device filer:/export mounted on /mnt/nfs\\040data with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.2,rsize=1048576,wsize=1048576
\tevents:\t1 2 3 4 5 6 7 8 9 10 11
\tbytes:\t100 200 0 0 100 200 1 1
\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)
\txprt:\ttcp 0 0 1 0 5 40 40 0 40 0 2 0 0
\tper-op statistics
\t        NULL: 1 1 0 44 24 0 0 0 0
\t        READ: 30 30 0 3120 1048576 1 20 25 0
\t       WRITE: 9 9 0 1048576 1000 0 30 31 0
\tOPEN_NOATTR: 0 0 0 0 0 0 0 0 0

device tmpfs mounted on /tmp with fstype tmpfs
"""


def test_nfs_replies_sums_each_nfs_mounts_answered_requests(tmp_path):
    stats = tmp_path / "mountstats"
    stats.write_text(MOUNTSTATS)
    assert nfs_replies(stats) == {"/mnt/nfs data": 40}
    assert nfs_replies(tmp_path / "none") == {}
