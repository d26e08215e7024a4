"""s3:// writes, uploads, renames and deletes through obstore, the one s3:// client stallscope runs:
each is the requests it should be at the emulated store, a refusal is one line naming the object and
the permission, an upload past MULTIPART_FROM goes in parts, and a whole round of listing, reading
and writing leaves s3fs unimported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stallscope.storage import location, s3_store
from stallscope.storage.emulator import emulate

from .conftest import BUCKET, child_environment

pytest.importorskip("obstore", reason="obstore (the stores extra) is the s3:// client")

LIMIT_S = 120


@pytest.fixture
def s3_emulated_store(tmp_path, monkeypatch):
    """A function that starts the emulated s3://data over `tmp_path/bucket` (writable or not) and
    points this process's s3:// client at it."""
    served = tmp_path / "bucket"
    served.mkdir()
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("STALLSCOPE_S3_READER", raising=False)

    def start(writable: bool):
        store = emulate(served, kind="s3", writable=writable, max_duration_s=LIMIT_S)
        started = store.__enter__()
        for name, value in started.env.items():
            monkeypatch.setenv(name, value)
        location.set_timeout(10)  # fresh clients, made with this endpoint
        location.forget_listings()
        opened.append(store)
        return started, served

    opened: list = []
    yield start
    for store in opened:
        store.__exit__(None, None, None)
    location.forget_listings()
    location.set_timeout(location.DEFAULT_TIMEOUT_S)


def test_a_write_an_upload_a_rename_and_a_delete_are_the_requests_they_should_be(s3_emulated_store, tmp_path):
    store, served = s3_emulated_store(writable=True)
    out = location.as_path(f"{store.url}/out")
    client = location.backend(out)
    client.write(out / "note.json", b"{}")  # the bucket's kept store is made here
    before = store.counters().requests
    client.write(out / "a.json", b'{"a": 1}')
    assert store.counters().requests - before == 1  # one PUT
    local = tmp_path / "shard.tfrecord"
    local.write_bytes(os.urandom(3 * s3_store.SMALL_TRANSFER))  # past SMALL_TRANSFER: a store of its own
    before = store.counters().requests
    client.upload(local, out / "shard.tmp")
    client.rename(out / "shard.tmp", out / "shard.tfrecord")
    assert store.counters().requests - before == 3  # a PUT, then a copy and a delete
    client.delete(out / "a.json")
    assert (served / "out" / "shard.tfrecord").read_bytes() == local.read_bytes()
    assert sorted(p.name for p in (served / "out").iterdir()) == ["note.json", "shard.tfrecord"]
    assert store.counters().errors == 0
    location.forget_listings()
    assert sorted(client.list(out).files) == ["note.json", "shard.tfrecord"]


def test_a_read_only_store_refuses_each_write_in_one_line_naming_the_object(s3_emulated_store, tmp_path):
    store, served = s3_emulated_store(writable=False)
    (served / "out").mkdir()
    (served / "out" / "kept.json").write_bytes(b"{}")
    out = location.as_path(f"{store.url}/out")
    client = location.backend(out)
    local = tmp_path / "shard.tfrecord"
    local.write_bytes(b"x" * 3 * s3_store.SMALL_TRANSFER)
    refusals = [
        (lambda: client.write(out / "a.json", b"{}"), f"{out}/a.json: s3:// refused to write (AccessDenied); "
                                                      "expected credentials and a bucket policy that allow s3:PutObject here"),
        (lambda: client.upload(local, out / "b.tfrecord"), f"{out}/b.tfrecord: s3:// refused to write (AccessDenied)"),
        (lambda: client.rename(out / "kept.json", out / "c.json"), f"{out}/c.json: s3:// refused to write (AccessDenied)"),
        (lambda: client.delete(out / "kept.json"), f"{out}/kept.json: s3:// refused to delete (AccessDenied); "
                                                   "expected credentials and a bucket policy that allow s3:DeleteObject here"),
    ]
    for operation, expected in refusals:
        with pytest.raises(location.StorageError) as caught:
            operation()
        assert str(caught.value).startswith(expected) and "\n" not in str(caught.value), str(caught.value)
    assert sorted(p.name for p in (served / "out").iterdir()) == ["kept.json"]


def test_a_missing_bucket_is_one_line_for_a_listing_a_write_and_a_delete(s3_emulated_store):
    store, _ = s3_emulated_store(writable=True)
    missing = location.as_path("s3://no-such-bucket/out/a.json")
    client = location.backend(missing)
    for operation in (lambda: client.list(missing.parent), lambda: client.write(missing, b"{}"),
                      lambda: client.delete(missing)):
        with pytest.raises(location.StorageError, match=r"^s3://no-such-bucket/out\S*: bucket 'no-such-bucket' "
                                                        r"does not exist; expected an existing bucket$"):
            operation()


def test_an_upload_past_multipart_from_goes_in_parts(s3_env, tmp_path, monkeypatch):
    """moto takes multipart uploads (the emulator refuses them); S3's parts are 5 MiB at the least."""
    monkeypatch.setattr(s3_store, "MULTIPART_FROM", 6 << 20)
    monkeypatch.setattr(s3_store, "MULTIPART_PART_BYTES", 5 << 20)
    local = tmp_path / "big.tfrecord"
    local.write_bytes(os.urandom(11 << 20))
    target = location.as_path(f"s3://{BUCKET}/multipart/big.tfrecord")
    location.backend(target).upload(local, target)  # `upload_file` would copy it whole to its name
    assert s3_env["client"].head_object(Bucket=BUCKET, Key="multipart/big.tfrecord")["ETag"].endswith('-3"')
    assert location.backend(target).read(target) == local.read_bytes()
    location.delete(target)


PROGRAM = """
import sys
from pathlib import Path
from stallscope.storage import location
root = location.as_path(sys.argv[1])
location.write_bytes(root / "out" / "a.json", b"{}")
local = Path(sys.argv[2])
local.write_bytes(b"x" * 200_000)
location.upload_file(local, root / "out" / "shard.tfrecord")
location.forget_listings()
files = sorted(str(p.relative_to(root)) for p in root.walk_files())
assert location.read_many(list(root.walk_files()), 4)
location.delete(root / "out" / "a.json")
print(files, sorted(name for name in ("s3fs", "aiobotocore", "fsspec") if name in sys.modules))
"""


def test_listing_reading_and_writing_s3_leave_s3fs_unimported(s3_emulated_store, tmp_path):
    store, served = s3_emulated_store(writable=True)
    (served / "in").mkdir()
    (served / "in" / "x.jpg").write_bytes(b"jpeg")
    done = subprocess.run([sys.executable, "-c", PROGRAM, store.url, str(tmp_path / "local.bin")], capture_output=True,
                          text=True, timeout=LIMIT_S, env=child_environment(store.env))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "['in/x.jpg', 'out/a.json', 'out/shard.tfrecord'] []"
    assert sorted(p.relative_to(served).as_posix() for p in served.rglob("*") if p.is_file()) == \
        ["in/x.jpg", "out/shard.tfrecord"]
