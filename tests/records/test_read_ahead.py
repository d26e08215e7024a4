"""A worker's reads ahead of its checks: the same items in the same order, errors kept as the file's
reason, auto off where reads are quick and on where they wait (a real FUSE mount paying a latency per
request), and a conversion from that mount writes the same shards as from the folder itself."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from stallscope.data import images
from stallscope.errors import UsageError
from stallscope.records import read_ahead
from stallscope.records.convert import ConvertOptions, convert_tree, format_summary, plan_conversion
from stallscope.records.read_ahead import FIRST_MAX_DEPTH, MAX_DEPTH, FileReader, choose_depth, next_depth
from stallscope.storage import location, mounts
from stallscope.storage.emulator import emulate
from stallscope.storage.location import StorageError
from stallscope.storage.emulator.fuse_mount import why_no_fuse

from .conftest import jpeg_bytes

WHY_NO_FUSE = why_no_fuse()
needs_fuse = pytest.mark.skipif(bool(WHY_NO_FUSE), reason=f"needs a FUSE mount (/dev/fuse, fuse3, mfusepy): {WHY_NO_FUSE}")
LIMIT_S = 120  # the mount's server stops itself after this


def _files(root: Path, count: int) -> list[tuple]:
    """`count` small files as work items (path, name, label, label_text), each holding its own index."""
    root.mkdir(parents=True, exist_ok=True)
    items = []
    for i in range(count):
        path = root / f"{i:03d}.bin"
        path.write_bytes(b"%d" % i * (i + 1))
        items.append((str(path), path.name.encode(), i % 3, b"c"))
    return items


def test_depth_is_0_where_reads_are_quick_or_a_small_share_and_covers_a_wait_otherwise():
    assert choose_depth(20e-6, 1e-3) == 0  # the page cache
    assert choose_depth(2e-3, 50e-3) == 0  # slow, but 4% of the work: one more worker covers it
    assert choose_depth(10e-3, 2e-3) == 6  # 5 files' work covers a read, plus one
    assert choose_depth(1.0, 1e-3) == FIRST_MAX_DEPTH  # where it starts; reads ahead tell it more


def test_depth_halves_where_the_store_queues_reads_and_doubles_where_checks_still_wait_on_a_free_store():
    # a read in flight takes 3x a read in turn: the store queues them, so fewer in flight
    assert next_depth(8, read_in_turn_s=10e-3, work_s=1e-3, read_ahead_s=30e-3, waited_s=5e-3) == 4
    assert next_depth(2, read_in_turn_s=10e-3, work_s=1e-3, read_ahead_s=30e-3, waited_s=5e-3) == 2
    # reads in flight as quick as in turn, and the checks still wait: more in flight
    assert next_depth(8, read_in_turn_s=10e-3, work_s=1e-3, read_ahead_s=11e-3, waited_s=1e-3) == 16
    assert next_depth(MAX_DEPTH, read_in_turn_s=10e-3, work_s=1e-3, read_ahead_s=11e-3, waited_s=1e-3) == MAX_DEPTH
    # the checks no longer wait: as it is
    assert next_depth(8, read_in_turn_s=10e-3, work_s=1e-3, read_ahead_s=11e-3, waited_s=10e-6) == 8


@pytest.mark.parametrize("depth", [0, 1, 3, None])
def test_items_come_in_order_with_their_bytes_and_errors_in_the_path_s_place(tmp_path, depth):
    items = _files(tmp_path / "files", 40)
    items.insert(5, (str(tmp_path / "files" / "gone.bin"), b"gone.bin", 0, b"c"))
    items.insert(9, (str(tmp_path / "files"), b"files", 1, b"c"))  # a folder: not readable as a file
    reader = FileReader(depth)
    got = list(reader.contents(items))
    assert [g[1:] for g in got] == [i[1:] for i in items]
    assert isinstance(got[5][0], FileNotFoundError) and isinstance(got[9][0], IsADirectoryError)
    for (data, *_), (path, *_) in zip(got, items):
        if not isinstance(data, OSError):
            assert data == Path(path).read_bytes()
    assert reader.task_stats()["depth"] == (depth or 0)


def test_auto_stays_in_turn_where_reads_are_quick(tmp_path):
    reader = FileReader(read_ahead.AUTO)
    for _ in reader.contents(_files(tmp_path / "files", 2 * read_ahead.PROBE_READS)):
        time.sleep(0.02)  # the checks' work: a page-cache read is a fraction of a percent of it
    stats = reader.task_stats()
    assert stats["depth"] == 0 and stats["timed_reads"] == 2 * read_ahead.PROBE_READS and stats["waited_s"] == 0


def test_leaving_a_read_ahead_early_does_not_wait_for_the_reads_in_flight(tmp_path):
    reader = FileReader(4)
    contents = reader.contents(_files(tmp_path / "files", 20))
    assert next(contents)[0] == b"0"
    contents.close()  # the checks failed: the generator ends without draining its window
    assert reader.depth == 4


def _tree(root: Path, per_class: int) -> Path:
    rng = np.random.default_rng(3)
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            (root / label / f"{i:02d}.jpg").write_bytes(jpeg_bytes(rng, (48, 32)))
    (root / "cat" / "cut.jpg").write_bytes(jpeg_bytes(rng, (48, 32))[:300])  # ends early: skipped
    (root / "dog" / "empty.jpg").write_bytes(b"")
    return root


@needs_fuse
def test_auto_reads_ahead_from_a_slow_mount_and_writes_the_same_shards(tmp_path):
    tree = _tree(tmp_path / "tree", per_class=20)
    local = convert_tree(ConvertOptions(tree, tmp_path / "local", shards=1, workers=1, read_ahead=0))
    mount = tmp_path / "mnt"
    mount.mkdir()
    with emulate(tree, kind="mount", mount_point=mount, latency_s=0.01, max_duration_s=LIMIT_S):
        items = [(str(p), p.name.encode(), 0, b"cat") for p in sorted((mount / "cat").iterdir())]
        reader = FileReader(read_ahead.AUTO)
        assert [d[0] for d in reader.contents(items)] == [Path(p).read_bytes() for p, *_ in items]
        assert reader.depth >= 2  # every read waits 10 ms or more (an open and a read), the work none
        assert reader.network and reader.network.startswith("fuse")  # so every read's wait is bounded
        assert mounts.network_file_system(tree) is None
        remote = convert_tree(ConvertOptions(mount, tmp_path / "mounted", shards=1, workers=2))
    assert remote.reads is not None and remote.reads.depth >= 2 and remote.reads.mean_read_s >= 0.01
    assert any("files ahead of its checks" in line for line in format_summary(remote))
    assert local.reads is None  # told to read in turn, nothing to say

    def comparable(out: Path) -> dict:
        manifest = json.loads((out / "manifest.json").read_text())
        for key in ("output_path", "dataset_path", "workers", "read_ahead"):
            del manifest["options"][key]
        del manifest["source"]
        return manifest

    assert comparable(tmp_path / "mounted") == comparable(tmp_path / "local")
    assert {e["reason"] for e in remote.manifest.skipped} == {images.CORRUPT, images.EMPTY}
    for shard in os.listdir(tmp_path / "local"):
        if shard.endswith(".tfrecord"):
            assert (tmp_path / "mounted" / shard).read_bytes() == (tmp_path / "local" / shard).read_bytes()


def test_a_thread_keeps_its_reader_and_another_thread_gets_its_own():
    first = read_ahead.process_reader(None)
    assert read_ahead.process_reader(None) is first  # what auto learned holds for the next task
    assert read_ahead.process_reader(4) is not first and read_ahead.process_reader(4).depth == 4
    other = []
    thread = threading.Thread(target=lambda: other.append(read_ahead.process_reader(4)))
    thread.start()
    thread.join()
    assert other[0] is not read_ahead.process_reader(4)


def test_a_negative_depth_is_refused_in_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"--read-ahead: expected 'auto' or a whole number >= 0, got -1"):
        ConvertOptions(tmp_path, tmp_path / "out", read_ahead=-1)


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /data rw,relatime shared:20 - nfs4 fs:/export rw,vers=4.2
41 40 0:36 / /data/my\\040bucket rw,nosuid shared:21 - fuse.gcsfuse bucket rw,user_id=0
42 22 8:17 / /mnt/usb rw,relatime shared:22 - fuseblk /dev/sdb1 rw
"""


def test_the_mount_table_names_each_path_s_file_system_and_which_are_networked(tmp_path):
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    kinds = {path: mounts.file_system_type(path, table) for path in
             ("/home/me", "/data/train/cat", "/data/my bucket/x.jpg", "/mnt/usb/a.jpg", "/data")}
    assert kinds == {"/home/me": "ext4", "/data/train/cat": "nfs4", "/data/my bucket/x.jpg": "fuse.gcsfuse",
                     "/mnt/usb/a.jpg": "fuseblk", "/data": "nfs4"}
    assert [mounts.is_network_type(k) for k in ("ext4", "nfs4", "fuse.gcsfuse", "fuse", "fuseblk", None)] == \
           [False, True, True, True, False, False]
    assert mounts.file_system_type("/x", tmp_path / "no-such-table") is None


def test_a_read_that_never_returns_is_one_line_naming_the_file_after_the_storage_timeout(tmp_path):
    fifo = tmp_path / "stuck.jpg"
    os.mkfifo(fifo)  # opening it for reading waits for a writer that does not come: a server that stopped
    raised: list[BaseException] = []

    def convert_it() -> None:
        try:
            list(FileReader(2).contents([(str(fifo), b"stuck.jpg", 0, b"c")]))
        except BaseException as exc:  # noqa: BLE001 - looked at below
            raised.append(exc)

    location.set_timeout(0.5)
    try:
        reading = threading.Thread(target=convert_it, daemon=True)
        reading.start()
        reading.join(20)  # a reader without the bound would still be waiting
        assert not reading.is_alive() and len(raised) == 1
        assert isinstance(raised[0], StorageError)
        assert str(raised[0]) == f"{fifo}: the file system did not answer a read in 0.5 s; expected it within --storage-timeout"
    finally:
        location.set_timeout(location.DEFAULT_TIMEOUT_S)
        try:  # lets the stuck read end, so its thread does too
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


@needs_fuse
def test_a_listing_that_does_not_answer_is_one_line_after_the_storage_timeout(tmp_path):
    tree = _tree(tmp_path / "tree", per_class=2)
    mount = tmp_path / "mnt"
    mount.mkdir()
    location.set_timeout(0.5)
    try:  # every listing call waits 10 s: a server that stopped answering, as far as a 0.5 s timeout knows
        with emulate(tree, kind="mount", mount_point=mount, latency_s=10.0, max_duration_s=LIMIT_S):
            started = time.monotonic()
            with pytest.raises(StorageError, match=r"^--dataset_path: the file system \(fuse[.\w-]*\) listing '.+/mnt' "
                                                   r"did not answer for 0.5 s \(after 0 files\); expected it within "
                                                   r"--storage-timeout$"):
                plan_conversion(ConvertOptions(mount, tmp_path / "out"))
            # before the first listing call came back, with room for a loaded machine (0.5 s asked)
            assert time.monotonic() - started < 8
    finally:
        location.set_timeout(location.DEFAULT_TIMEOUT_S)


def test_watched_work_may_take_long_while_it_moves_and_is_given_up_once_it_stops():
    location.set_timeout(1.5)
    try:
        count = [0]

        def steady() -> str:
            # 3 s in all, twice the timeout, a step every 0.1 s: a loaded machine that wakes this thread
            # late stays far inside 1.5 s without a step (against 0.3 s, a 0.2 s delay read as stuck)
            for _ in range(30):
                time.sleep(0.1)
                count[0] += 1
            return "listed"

        assert mounts.watched(steady, lambda: count[0], "the listing") == "listed"
        location.set_timeout(0.3)
        stuck = threading.Event()
        with pytest.raises(StorageError, match=r"^the listing did not answer for 0.3 s \(after 0 files\)"):
            mounts.watched(lambda: stuck.wait(10), lambda: 0, "the listing")
        stuck.set()
        with pytest.raises(ValueError):  # the work's own error, in the caller's thread
            mounts.watched(lambda: int("x"), lambda: 0, "the listing")
    finally:
        location.set_timeout(location.DEFAULT_TIMEOUT_S)
