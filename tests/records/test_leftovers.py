"""convert leaves nothing behind: its lock names a live process, and a dead run's unfinished files go
before anything is written (a full disk among them). convert stopped by a signal, and into a full disk
from the command line: tests/faults/test_convert.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from stallscope.records.completeness import STATE_DIR
from stallscope.records.convert import ConvertOptions, convert_tree
from stallscope.records.lock import LOCK_NAME, ExclusiveLock, LockedError, holder_text


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _end(processes):
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


# A convert killed while a process it forked kept the lock's descriptor (what older versions' workers
# did): the lock file names the dead parent; the orphan holds the lock and sleeps.
_ORPHAN_HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    from stallscope.records.lock import holder_text
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, holder_text().encode())
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    os._exit(0)
""")


def test_a_lock_held_only_by_a_dead_runs_orphan_is_taken_over(tiny_tree, tmp_path):
    out = tmp_path / "out"
    (out / STATE_DIR).mkdir(parents=True)
    lock = out / STATE_DIR / LOCK_NAME
    maker = subprocess.Popen([sys.executable, "-c", _ORPHAN_HOLDER, str(lock)], stdout=subprocess.PIPE, text=True,
                             env=_env())
    with maker.stdout:  # read a line, not to the end: the orphan keeps the pipe open
        orphan = psutil.Process(int(maker.stdout.readline()))
    maker.wait(timeout=60)
    try:
        assert orphan.is_running() and str(maker.pid) in lock.read_text()
        report = convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1))
        assert report.examples == 24 and (out / "manifest.json").exists()
        assert orphan.is_running(), "the orphan is left alone: it is named in the log, not killed"
    finally:
        _end([orphan])


def test_a_live_holder_is_refused_by_name(tmp_path):
    path = tmp_path / LOCK_NAME
    held = ExclusiveLock(path, what="test").acquire()
    try:
        with pytest.raises(LockedError, match=f"test is already running \\(PID {os.getpid()} on host [^)]+\\);"):
            ExclusiveLock(path, what="test").acquire()
    finally:
        held.release()


def test_a_lock_naming_a_pid_that_now_is_another_process_is_taken_over(tmp_path):
    """The holder's PID runs, but started at another time than the holder did: a later process under a
    dead holder's PID (PIDs are reused, soon in a container) does not keep the lock taken."""
    path = tmp_path / LOCK_NAME
    held = ExclusiveLock(path, what="test").acquire()  # the orphan's descriptor, in this test
    try:
        path.write_text(holder_text().replace("\nstarted ", "\nstarted 1"))
        ExclusiveLock(path, what="test").acquire().release()
    finally:
        held.release()


def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    path = tmp_path / LOCK_NAME
    held = ExclusiveLock(path, what="test").acquire()
    ready, tell = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child sleeps until killed
        os.write(tell, b"x")  # the fork's hooks have run by now
        time.sleep(60)
        os._exit(0)
    try:
        os.close(tell)
        assert os.read(ready, 1) == b"x"
        os.close(ready)
        held.release()
        ExclusiveLock(path, what="test").acquire().release()  # free once the parent lets go
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_dead_runs_temporaries_go_before_anything_is_written(tiny_tree, small_disk):
    out = small_disk / "out"
    (out / STATE_DIR).mkdir(parents=True)
    dead = out / ".train-00000-of-00002.tfrecord.tmp-4194304"  # a killed run's: it filled the disk
    with open(dead, "wb", buffering=0) as handle, pytest.raises(OSError):
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()
    report = convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1))
    assert report.examples == 24 and not dead.exists()


def test_runs_taking_over_a_dead_holders_lock_at_once_leave_it_to_one(tmp_path):
    """Six takers at the same moment (threads: each opens the file itself, so the kernel tells their
    locks apart as it does processes'), the lock held by an orphan of a dead run: exactly one holds it."""
    import threading

    path = tmp_path / LOCK_NAME
    orphan = ExclusiveLock(path, what="test").acquire()  # the orphan's descriptor, in this test
    path.write_text(holder_text().replace("\nstarted ", "\nstarted 1"))  # names a run that no longer runs
    start = threading.Barrier(6)
    won, refused = [], []

    def take():
        start.wait(timeout=30)
        try:
            won.append(ExclusiveLock(path, what="test").acquire())
        except LockedError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=take) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(won) == 1 and len(refused) == 5, (len(won), refused)
    finally:
        for lock in (orphan, *won):
            lock.release()
