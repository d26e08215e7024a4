"""The emulator as a slow FUSE mount (`stallscope storage serve DIR --mount MNT`): any reader sees the
folder's bytes, every open pays the latency, and SIGTERM unmounts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.analysis.storage_counters import load_storage_counters
from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.fuse_mount import why_no_fuse

from .conftest import child_environment
from .test_emulator import LIMIT_S, digests

WHY_NO_FUSE = why_no_fuse()
pytestmark = pytest.mark.skipif(bool(WHY_NO_FUSE), reason=f"FUSE mount tests need /dev/fuse, fuse3 (libfuse3, "
                                                          f"fusermount3) and mfusepy: {WHY_NO_FUSE}")


def test_a_mount_reads_the_same_bytes_and_pays_latency_per_open(tiny_tree, tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    with emulate(tiny_tree, kind="mount", mount_point=mount, latency_s=0.02, max_duration_s=LIMIT_S) as store:
        assert store.url == str(mount.resolve()) and os.path.ismount(mount)
        with pytest.raises(OSError):  # read-only
            (mount / "class_00" / "new.jpg").write_bytes(b"x")
        started = time.monotonic()
        read = digests(mount)
        elapsed = time.monotonic() - started
        counted = store.counters()
    assert not os.path.ismount(mount) and not any(mount.iterdir())  # unmounted on leaving the block
    assert read == digests(tiny_tree) and len(read) == 24
    assert elapsed >= 24 * 0.02  # each sequential open (and read) waits 20 ms: a lower bound
    assert counted.connections == 24 and counted.requests >= 2 * 24 and counted.lists >= 1
    assert counted.bytes == sum(p.stat().st_size for p in tiny_tree.rglob("*.jpg"))


def test_a_writable_mount_writes_into_its_folder_at_the_latency(tmp_path):
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    with emulate(served, kind="mount", mount_point=mount, latency_s=0.05, writable=True,
                 max_duration_s=LIMIT_S) as store:
        (mount / "out").mkdir()
        started = time.monotonic()
        fd = os.open(mount / "out" / ".part.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"shard bytes")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(mount / "out" / ".part.tmp", mount / "out" / "part")  # create, write, fsync, rename
        elapsed = time.monotonic() - started
        (mount / "out" / "gone").write_bytes(b"x")
        (mount / "out" / "gone").unlink()
        # the kernel caches writes (as an NFS client does): an append through a write-only handle has it
        # read the file's last page back through the daemon's handle of that file
        with open(mount / "out" / "part", "ab") as appended:
            appended.write(b", appended")
        counted = store.counters()
    assert sorted(p.relative_to(served).as_posix() for p in served.rglob("*")) == ["out", "out/part"]
    assert (served / "out" / "part").read_bytes() == b"shard bytes, appended"
    assert elapsed >= 4 * 0.05  # each of the four requests waited the latency
    assert counted.requests >= 7 and counted.errors == 0


def test_sigterm_unmounts_and_exits_0(tiny_tree, tmp_path):
    mount, ready, counters_file = tmp_path / "mnt", tmp_path / "ready.json", tmp_path / "counters.json"
    mount.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "stallscope", "storage", "serve", str(tiny_tree),
                                "--mount", str(mount), "--latency", "1ms", "--for", "60s",
                                "--ready-file", str(ready), "--counters", str(counters_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment())
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
            time.sleep(0.05)
        assert json.loads(ready.read_text())["url"] == str(mount.resolve()) and os.path.ismount(mount)
        one = tiny_tree / "class_02" / "img_007.jpg"
        assert (mount / "class_02" / "img_007.jpg").read_bytes() == one.read_bytes()
        os.kill(process.pid, signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
            subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True, timeout=10)
    assert process.returncode == 0 and "Traceback" not in err, err
    assert f"mounted read-only at {mount.resolve()}" in out
    assert not os.path.ismount(mount)
    assert load_storage_counters(counters_file).connections == 1


def test_a_mount_point_that_is_not_empty_is_one_line(tiny_tree, tmp_path):
    mount = tmp_path / "mnt"
    (mount / "something").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "stallscope", "storage", "serve", str(tiny_tree),
                           "--mount", str(mount)], capture_output=True, text=True, timeout=LIMIT_S, env=child_environment())
    assert done.returncode == 2
    assert done.stderr.strip() == (f"stallscope storage: error: --mount: expected an empty folder to mount at, "
                                   f"got {str(mount)!r} (not empty)")


def test_without_fusermount3_the_mount_is_refused_in_one_line(tiny_tree, tmp_path):
    """A machine without fuse3: here, a PATH on which fusermount3 cannot be found."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run([sys.executable, "-m", "stallscope", "storage", "serve", str(tiny_tree), "--mount", str(mount)],
                          capture_output=True, text=True, timeout=LIMIT_S, env=child_environment({"PATH": str(tmp_path)}))
    assert done.returncode == 2 and not os.path.ismount(mount)
    assert done.stderr.strip() == ("stallscope storage: error: --mount: expected FUSE on this machine, got "
                                   "fusermount3 is not installed (Debian/Ubuntu: apt-get install fuse3)")
