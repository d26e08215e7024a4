"""An output folder on a network file system: convert writes there as on a local disk, and a server
that stops answering a write, an fsync or a mkdir ends the run in one line instead of hanging it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stallscope.records.convert import ConvertOptions, SegmentTask, _segment_tasks, convert_tree, plan_conversion
from stallscope.storage.mounts import NetworkGuard, Ticks
from stallscope.storage import location
from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.fuse_mount import why_no_fuse
from stallscope.storage.location import StorageError

from ..storage.conftest import child_environment
from .test_read_ahead import _tree

WHY_NO_FUSE = why_no_fuse()
needs_fuse = pytest.mark.skipif(bool(WHY_NO_FUSE), reason=f"needs a FUSE mount (/dev/fuse, fuse3, mfusepy): {WHY_NO_FUSE}")
LIMIT_S = 120  # the mount's server stops itself after this


@pytest.fixture
def short_timeout():
    location.set_timeout(0.5)
    yield 0.5
    location.set_timeout(location.DEFAULT_TIMEOUT_S)


def test_on_a_local_disk_the_work_runs_in_place(tmp_path):
    guard = NetworkGuard.of(tmp_path)
    assert guard.fstype is None
    assert guard(lambda: threading.current_thread(), "writing x") is threading.current_thread()


def test_on_a_network_file_system_work_that_stops_moving_is_given_up(short_timeout, caplog):
    guard = NetworkGuard("nfs4")
    assert guard(lambda: threading.current_thread(), "writing x") is not threading.current_thread()
    ticks = Ticks()

    def steady() -> str:
        for _ in range(6):  # 0.9 s in all, never 0.5 s without a step
            time.sleep(0.15)
            ticks.count += 1
        return "written"

    assert guard(steady, "writing 'out/a.tfrecord'", ticks) == "written"
    stuck = threading.Event()
    try:
        with pytest.raises(StorageError, match=r"^--output_path: the file system \(nfs4\) writing 'out/a.tfrecord' did "
                                               r"not answer for 0.5 s \(after 0 images\); expected it within "
                                               r"--storage-timeout$"):
            guard(lambda: stuck.wait(10), "writing 'out/a.tfrecord'", Ticks())
        with pytest.raises(StorageError, match=r"writing 'out/manifest.json' did not answer for 0.5 s; expected"):
            guard(lambda: stuck.wait(10), "writing 'out/manifest.json'")  # no progress: the whole step is bounded
        with caplog.at_level(logging.WARNING, logger="stallscope.storage.mounts"):
            guard.cleanup(lambda: stuck.wait(10), "unlocking 'out'")  # logged, not raised
        assert "unlocking 'out' did not answer for 0.5 s; expected it within --storage-timeout; left as it is" in caplog.text
    finally:
        stuck.set()
    with pytest.raises(ValueError):  # the work's own error, in the caller's thread
        guard(lambda: int("x"), "writing x")


def _comparable(out: Path) -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("output_path", "workers"):
        del manifest["options"][key]
    return manifest


@needs_fuse
def test_convert_writes_the_same_shards_into_a_slow_mount_and_again_over_them(tmp_path):
    tree = _tree(tmp_path / "tree", per_class=12)
    local = convert_tree(ConvertOptions(tree, tmp_path / "local", shards=2))
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    with emulate(served, kind="mount", mount_point=mount, latency_s=0.002, writable=True, max_duration_s=LIMIT_S) as store:
        assert NetworkGuard.of(mount / "records").fstype.startswith("fuse")
        written = convert_tree(ConvertOptions(tree, mount / "records", shards=2, workers=2))
        assert store.counters().requests > 0
        again = convert_tree(ConvertOptions(tree, mount / "records", shards=2, workers=1))  # over its own output
    assert written.examples == again.examples == local.examples and written.shards == again.shards == 2
    assert _comparable(served / "records") == _comparable(tmp_path / "local")
    shards = sorted(p.name for p in (tmp_path / "local").glob("*.tfrecord"))
    assert shards and sorted(p.name for p in (served / "records").iterdir()) == sorted(shards + ["labels.txt", "manifest.json"])
    for name in shards:
        assert (served / "records" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()


@needs_fuse
def test_a_worker_whose_writes_stop_answering_gives_up_naming_the_shard(tmp_path, short_timeout):
    from stallscope.records.convert import write_segment

    tree = _tree(tmp_path / "tree", per_class=4)
    served, mount = tmp_path / "served", tmp_path / "mnt"
    (served / "out" / ".state").mkdir(parents=True)  # made beside the mount: only the shard's writes go through it
    mount.mkdir()
    options = ConvertOptions(tree, mount / "out", shards=1, workers=1)
    plan = plan_conversion(options)
    with emulate(served, kind="mount", mount_point=mount, latency_s=3.0, writable=True, max_duration_s=LIMIT_S):
        guard = NetworkGuard.of(mount / "out")
        task: SegmentTask = next(_segment_tasks(options, plan.shards, mount / "out" / ".state", 1, guard.fstype))
        started = time.monotonic()
        with pytest.raises(StorageError, match=r"^--output_path: the file system \(fuse[.\w-]*\) writing '.+/mnt/out/"
                                               r"train-00000-of-00001.tfrecord' did not answer for 0.5 s \(after 0 "
                                               r"images\); expected it within --storage-timeout$"):
            write_segment(task)
        assert time.monotonic() - started < 2.5  # before the shard's create came back
    # The thread left behind saw it was given up once the create came back: no shard, no state.
    assert not [p.name for p in (served / "out").rglob("*") if not p.name.startswith(".") or p.suffix == ".json"]


@needs_fuse
def test_an_output_that_stops_answering_ends_convert_in_one_line(tmp_path):
    tree = _tree(tmp_path / "tree", per_class=4)
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    with emulate(served, kind="mount", mount_point=mount, latency_s=5.0, writable=True, max_duration_s=LIMIT_S):
        process = subprocess.Popen([sys.executable, "-m", "stallscope", "convert", str(tree), "--output_path",
                                    str(mount / "out"), "--storage-timeout", "0.5"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment())
        try:
            line = process.stderr.readline()
            told = time.monotonic()
            rest = process.stderr.read()
            process.wait(60)
            ended = time.monotonic()
        finally:
            process.kill()
    assert process.returncode == 2 and not rest and "Traceback" not in line, line + rest
    assert line.startswith("stallscope convert: error: --output_path: the file system (fuse"), line
    assert line.rstrip().endswith(f"preparing {str(mount / 'out')!r} did not answer for 0.5 s; expected it within "
                                  "--storage-timeout"), line
    # The line comes once the mkdir has waited 0.5 s; a FUSE request already with its server is waited out
    # by the kernel before the process can exit (an NFS one is not), so the exit comes after the 5 s.
    assert ended - told > 2.5
    assert not any(served.rglob("*.tfrecord"))


@needs_fuse
def test_verify_reads_shards_on_a_slow_mount_and_gives_up_on_one_that_stops_answering(tmp_path, short_timeout):
    from stallscope.records.verify import verify_records

    tree = _tree(tmp_path / "tree", per_class=6)
    convert_tree(ConvertOptions(tree, tmp_path / "records", shards=2))
    mount = tmp_path / "mnt"
    mount.mkdir()
    with emulate(tmp_path / "records", kind="mount", mount_point=mount, latency_s=0.01, max_duration_s=LIMIT_S):
        report = verify_records(mount, decode=False)
    assert report.ok and len(report.shards) == 2
    with emulate(tmp_path / "records", kind="mount", mount_point=mount, latency_s=3.0, max_duration_s=LIMIT_S):
        started = time.monotonic()
        with pytest.raises(StorageError, match=r"^RECORDS_DIR: the file system \(fuse[.\w-]*\) listing '.+/mnt' did not "
                                               r"answer for 0.5 s; expected it within --storage-timeout$"):
            verify_records(mount, decode=False)
        assert time.monotonic() - started < 2.5


@needs_fuse
def test_a_beam_worker_whose_writes_stop_answering_gives_up_naming_the_shard(tmp_path, short_timeout):
    from stallscope.records.beam_convert import _write_plan_files, convert_shard

    tree = _tree(tmp_path / "tree", per_class=4)
    served, mount, state = tmp_path / "served", tmp_path / "mnt", tmp_path / "state"
    (served / "out").mkdir(parents=True)
    state.mkdir()
    mount.mkdir()
    options = ConvertOptions(tree, mount / "out", shards=1)
    task = _write_plan_files(options, state, plan_conversion(options).shards)[0]  # the item list on local disk
    with emulate(served, kind="mount", mount_point=mount, latency_s=3.0, writable=True, max_duration_s=LIMIT_S):
        started = time.monotonic()
        with pytest.raises(StorageError, match=r"^--output_path: the file system \(fuse[.\w-]*\) writing '.+/mnt/out/"
                                               r"train-00000-of-00001.tfrecord' did not answer for 0.5 s \(after \d+ "
                                               r"images\); expected it within --storage-timeout$"):
            convert_shard(task)
        assert time.monotonic() - started < 2.5
