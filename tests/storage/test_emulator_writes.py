"""The storage emulator served `--writable`: what TF's own gs:// and obstore's s3:// write lands in the folder,
whole or not at all, and `stallscope convert` writes its shards into an emulated bucket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.storage import location
from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.folder_bucket import FOLDER_MARKER, PART_PREFIX, FolderBucket, WriteRefused

from .conftest import child_environment

LIMIT_S = 120  # every child here is bounded


def test_a_writable_folder_bucket_hides_objects_until_they_are_whole(tmp_path):
    bucket = FolderBucket(tmp_path, "data", writable=True)
    part, handle = bucket.open_part("a/b/x.bin")
    handle.write(b"half")
    handle.flush()
    assert part.name.startswith(PART_PREFIX) and part.parent == tmp_path / "a" / "b"
    assert bucket.stat("a/b/x.bin") is None and bucket.list("a/").objects == ()  # not an object yet
    assert bucket.path_of(f"a/b/{part.name}") is None
    handle.write(b" and whole")
    handle.close()
    info = bucket.commit("a/b/x.bin", part)
    assert (info.key, info.size) == ("a/b/x.bin", 14) and [o.key for o in bucket.list("a/").objects] == ["a/b/x.bin"]
    assert bucket.copy("a/b/x.bin", "a/c.bin").size == 14 and (tmp_path / "a" / "c.bin").read_bytes() == b"half and whole"
    assert bucket.copy("a/missing", "a/d.bin") is None
    bucket.put("a/b/", b"")  # a folder object, as a gs:// makedirs writes it
    assert (tmp_path / "a" / "b" / FOLDER_MARKER).exists() and bucket.stat("a/b/").size == 0
    assert [o.key for o in bucket.list("a/").objects] == ["a/b/", "a/b/x.bin", "a/c.bin"]
    assert bucket.delete("a/b/x.bin") and bucket.delete("a/b/") and not bucket.delete("a/b/x.bin")
    assert not (tmp_path / "a" / "b").exists()  # the folders it left empty went with it
    for key in ("../outside", "a//b", "/abs", "a/c.bin/under-an-object"):
        with pytest.raises(WriteRefused):
            bucket.put(key, b"x")
    assert not (tmp_path.parent / "outside").exists()
    with pytest.raises(WriteRefused, match="read-only: start it with --writable"):
        FolderBucket(tmp_path, "data").put("new.bin", b"x")


TF_WRITES_GS = """
import json, os, sys
import tensorflow as tf
url, local = sys.argv[1], sys.argv[2]
g = tf.io.gfile
g.makedirs(url + "/out/deep")
with g.GFile(url + "/out/deep/a.bin", "wb") as f:
    f.write(b"a" * 300000)
g.copy(local, url + "/out/b.bin", overwrite=True)
g.rename(url + "/out/b.bin", url + "/out/c.bin", overwrite=True)
with tf.io.TFRecordWriter(url + "/out/s.tfrecord") as w:
    for i in range(20):
        w.write(bytes([i]) * i)
g.remove(url + "/out/deep/a.bin")
try:
    with g.GFile(url + "/../escape.bin", "wb") as f:
        f.write(b"x")
    escaped = "written"
except tf.errors.OpError as e:
    escaped = type(e).__name__
print(json.dumps({"listing": sorted(g.listdir(url + "/out")), "records": sum(1 for _ in tf.data.TFRecordDataset(
    url + "/out/s.tfrecord")), "c": g.GFile(url + "/out/c.bin", "rb").read() == open(local, "rb").read(),
    "escaped": escaped}))
"""


def test_tfs_gs_writes_land_in_the_folder(tmp_path):
    served, local = tmp_path / "bucket", tmp_path / "local.bin"
    served.mkdir()
    local.write_bytes(os.urandom(2_500_000))
    with emulate(served, kind="gcs", latency_s=0.001, writable=True, max_duration_s=LIMIT_S) as store:
        done = subprocess.run([sys.executable, "-c", TF_WRITES_GS, store.url, str(local)], capture_output=True,
                              text=True, timeout=LIMIT_S, env=child_environment(store.env))
        counted = store.counters()
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["listing"] == ["c.bin", "deep/", "s.tfrecord"] and result["records"] == 20 and result["c"]
    assert result["escaped"] != "written"
    assert (served / "out" / "c.bin").read_bytes() == local.read_bytes()
    assert sorted(p.relative_to(served).as_posix() for p in served.rglob("*") if p.is_file()) == \
        [f"out/{FOLDER_MARKER}", "out/c.bin", f"out/deep/{FOLDER_MARKER}", "out/s.tfrecord"]  # no upload part left
    assert counted.requests > 10


def test_convert_writes_its_shards_into_an_emulated_bucket_and_refuses_a_read_only_one(tmp_path, tiny_tree):
    served = tmp_path / "bucket"
    served.mkdir()
    convert = [sys.executable, "-m", "stallscope", "convert", str(tiny_tree), "--output-path", "gs://data/records",
               "--train-shards", "2", "--workers", "1", "--no-progress"]
    with emulate(served, kind="gcs", max_duration_s=LIMIT_S) as store:  # read-only
        refused = subprocess.run(convert, capture_output=True, text=True, timeout=LIMIT_S,
                                 env=child_environment(store.env))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "gs://data/records" in refused.stderr and "refused to write" in refused.stderr
    assert not any(served.iterdir())
    with emulate(served, kind="gcs", latency_s=0.002, writable=True, max_duration_s=LIMIT_S) as store:
        done = subprocess.run(convert, capture_output=True, text=True, timeout=LIMIT_S, env=child_environment(store.env))
        assert done.returncode == 0, done.stderr[-3000:]
        verified = subprocess.run([sys.executable, "-m", "stallscope", "verify", "gs://data/records"],
                                  capture_output=True, text=True, timeout=LIMIT_S, env=child_environment(store.env))
    assert verified.returncode == 0 and "OK: 2 shard(s), 24 records" in verified.stdout, verified.stdout + verified.stderr
    written = sorted(p.relative_to(served / "records").as_posix() for p in (served / "records").rglob("*") if p.is_file())
    assert written == ["labels.txt", "manifest.json", "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]


def test_s3_writes_land_in_the_folder_and_a_read_only_store_refuses_them(tmp_path, monkeypatch):
    served = tmp_path / "bucket"
    served.mkdir()
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    for writable in (False, True):
        with emulate(served, kind="s3", writable=writable, max_duration_s=LIMIT_S) as store:
            for name, value in store.env.items():
                monkeypatch.setenv(name, value)
            location.set_timeout(10)
            location.forget_listings()
            try:
                out = location.as_path(f"{store.url}/out")
                if not writable:
                    with pytest.raises(location.StorageError, match=r"^s3://data/out/\S*a\.bin\S*: s3:// refused to "
                                                                    r"write \(AccessDenied\)"):
                        location.write_bytes(out / "a.bin", b"x")
                    continue
                location.write_bytes(out / "a.bin", b"hello" * 50_000)
                source = tmp_path / "local.bin"
                source.write_bytes(os.urandom(300_000))
                location.upload_file(source, out / "b.bin")
                location.backend(out).rename(out / "b.bin", out / "c.bin")
                location.forget_listings()
                assert sorted(p.name for p in out.iterdir()) == ["a.bin", "c.bin"]
                assert (out / "c.bin").read_bytes() == source.read_bytes()
                location.delete(out / "a.bin")
            finally:
                location.forget_listings()
                location.set_timeout(location.DEFAULT_TIMEOUT_S)
    assert sorted(p.relative_to(served).as_posix() for p in served.rglob("*") if p.is_file()) == ["out/c.bin"]
    assert (served / "out" / "c.bin").read_bytes() == source.read_bytes()


@pytest.fixture
def writable_s3(tmp_path, monkeypatch):
    """A writable emulated S3 bucket and this process's s3:// client pointed at it."""
    served = tmp_path / "bucket"
    served.mkdir()
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    with emulate(served, kind="s3", writable=True, max_duration_s=LIMIT_S) as store:
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        location.set_timeout(10)
        location.forget_listings()
        yield location.as_path(f"{store.url}/records"), served
        location.forget_listings()
        location.set_timeout(location.DEFAULT_TIMEOUT_S)


def test_a_bucket_lease_keeps_a_second_conversion_out_until_it_ends(writable_s3, monkeypatch):
    import socket
    import time

    from stallscope.records import remote_lock
    from stallscope.records.lock import LockedError

    monkeypatch.setattr(remote_lock, "SETTLE_S", 0.05)
    out, served = writable_s3
    lock = out / ".stallscope-convert" / remote_lock.LOCK_OBJECT
    with remote_lock.bucket_lease(out, "stallscope convert A", heartbeat_s=0.05):
        first = json.loads(lock.read_bytes())
        assert first["pid"] == os.getpid() and first["command"] == "stallscope convert A"
        time.sleep(0.3)
        location.forget_listings()
        assert json.loads(lock.read_bytes())["heartbeat"] > first["heartbeat"]  # renewed while held
        with pytest.raises(LockedError, match=rf"another `stallscope convert` into {out} is running \(PID "
                                              rf"{os.getpid()} on {socket.gethostname()}"):
            with remote_lock.bucket_lease(out, "stallscope convert B"):
                pass
    location.forget_listings()
    assert not lock.exists() and not (served / "records" / ".stallscope-convert" / "lock.json").exists()

    def left(host: str, pid: int, age_s: float) -> None:
        location.write_bytes(lock, json.dumps({"host": host, "pid": pid, "heartbeat": time.time() - age_s}).encode())
        location.forget_listings()

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left(socket.gethostname(), int(dead.stdout), 5)  # a run on this host that died a moment ago
    with remote_lock.bucket_lease(out, "C"):
        pass
    left("another-host", 1, remote_lock.LEASE_S + 60)  # silent past its lease
    with remote_lock.bucket_lease(out, "D"):
        pass
    left("another-host", 1, 5)  # beating elsewhere: only its heartbeat tells
    with pytest.raises(LockedError, match="PID 1 on another-host, heartbeat 5 s ago"):
        with remote_lock.bucket_lease(out, "E"):
            pass


def test_a_lease_naming_a_pid_that_now_is_another_process_is_taken_over(writable_s3, monkeypatch):
    """A PID alone looked alive once the kernel handed it to another process: the lease records the
    holder's start time, and a PID running under another start time is a dead holder."""
    import socket
    import time

    import psutil

    from stallscope.records import remote_lock
    from stallscope.records.lock import LockedError

    monkeypatch.setattr(remote_lock, "SETTLE_S", 0.05)
    out, _ = writable_s3
    lock = out / ".stallscope-convert" / remote_lock.LOCK_OBJECT
    me = psutil.Process()

    def left(process_started: float) -> None:  # a run of this host, under this test's PID, beating just now
        location.write_bytes(lock, json.dumps({"host": socket.gethostname(), "pid": me.pid, "command": "A",
                                               "started": time.time(), "process_started": process_started,
                                               "heartbeat": time.time()}).encode())
        location.forget_listings()

    left(me.create_time())  # the holder runs
    with pytest.raises(LockedError, match=f"PID {me.pid} on {socket.gethostname()}"):
        with remote_lock.bucket_lease(out, "B"):
            pass
    left(me.create_time() - 3600)  # the holder died; this PID is another process's now
    with remote_lock.bucket_lease(out, "C"):
        assert json.loads(lock.read_bytes())["process_started"] == pytest.approx(me.create_time())


def test_of_two_runs_that_find_a_prefix_free_at_once_only_the_later_writer_holds_it(writable_s3, monkeypatch):
    import time

    from stallscope.records import remote_lock
    from stallscope.records.lock import LockedError

    out, _ = writable_s3
    lock = out / ".stallscope-convert" / remote_lock.LOCK_OBJECT
    rival = {"host": "another-host", "pid": 4242, "command": "stallscope convert B", "started": time.time(),
             "heartbeat": time.time()}

    def rival_writes_while_we_settle(seconds: float) -> None:  # B looked before A wrote, and writes now
        location.write_bytes(lock, json.dumps(rival).encode())

    monkeypatch.setattr(remote_lock, "_settle", rival_writes_while_we_settle)
    entered = []
    with pytest.raises(LockedError, match=r"holds the lease now \(PID 4242 on another-host\)"):
        with remote_lock.bucket_lease(out, "stallscope convert A"):
            entered.append(True)
    assert not entered
    assert json.loads(location.backend(lock).read(lock)) == rival  # B's lease stays: A wrote no more, deleted nothing


def test_a_run_whose_lease_was_taken_over_neither_renews_nor_deletes_it_and_confirms_no_more(writable_s3, monkeypatch):
    import time

    from stallscope.records import remote_lock
    from stallscope.records.lock import LockedError

    monkeypatch.setattr(remote_lock, "SETTLE_S", 0.05)
    out, _ = writable_s3
    lock = out / ".stallscope-convert" / remote_lock.LOCK_OBJECT
    rival = {"host": "another-host", "pid": 4343, "command": "stallscope convert B", "started": time.time(),
             "heartbeat": time.time()}
    with remote_lock.bucket_lease(out, "stallscope convert A", heartbeat_s=0.05) as lease:
        lease.confirm()  # ours
        location.write_bytes(lock, json.dumps(rival).encode())  # B took it over while A was silent
        waited = time.monotonic() + 30
        while lease.lost_to is None and time.monotonic() < waited:
            time.sleep(0.05)
        time.sleep(0.2)  # beats that would overwrite B's lease, were there any
        assert json.loads(location.backend(lock).read(lock)) == rival
        with pytest.raises(LockedError, match=r"holds the lease now \(PID 4343 on another-host\); this run writes "
                                              r"nothing more there"):
            lease.confirm()
    assert json.loads(location.backend(lock).read(lock)) == rival  # B's lease outlives A's block


@pytest.mark.parametrize("bandwidth", [None, 10e9], ids=["server", "proxy"])  # a cap that never binds: the proxy
def test_an_upload_that_waits_for_100_continue_pays_two_round_trips(tmp_path, bandwidth):
    """Headers, then '100 Continue', then the body and the answer: two round trips at 50 ms each,
    whether the S3 server's event loop or the latency proxy holds them (a lower bound)."""
    import socket
    import time

    body = b"x" * 1000
    with emulate(tmp_path, kind="s3", latency_s=0.05, bandwidth_bps=bandwidth, writable=True,
                 max_duration_s=LIMIT_S) as store:
        with socket.create_connection(("127.0.0.1", store.port), timeout=10) as client:
            started = time.monotonic()
            client.sendall(b"PUT /data/up.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body))
            assert client.recv(1024).startswith(b"HTTP/1.1 100")
            client.sendall(body)
            answer = client.recv(4096)
            elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert elapsed >= 2 * 0.05
    assert (tmp_path / "up.bin").read_bytes() == body
