"""One deadline per s3:// operation, retries included: a store that accepts connections and never
answers fails each operation within about --storage-timeout (botocore's attempts and s3fs's retries
each waited the whole timeout: 23-29 s at a 3 s timeout; a rename through fsspec's mv, minutes).
Listings, writes, uploads, renames and deletes go through obstore whichever reader reads."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest

from stallscope.storage import location, s3_request_plan
from stallscope.storage.location import StorageError
from stallscope.storage.s3_store import S3Store

from .conftest import BUCKET, s3_environment

# How soon each deadline fires: a test beside it on 2 cores would delay the clients' threads.
pytestmark = pytest.mark.whole_machine

TIMEOUT_S = 1.0
# The operation's own deadline plus room for a loaded machine; every retry waiting the whole timeout
# (two botocore attempts, each retried by s3fs) takes at least 4x the timeout.
WITHIN_S = 3.0


@pytest.fixture
def silent_store(monkeypatch, silent_port):
    """This process pointed at a loopback port that accepts connections and never answers, with
    credentials and no region (the obstore reader then asks the store for the bucket's region)."""
    endpoint = f"http://127.0.0.1:{silent_port}"
    for name, value in s3_environment({"key": "key", "secret": "secret", "endpoint": endpoint}).items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    location.set_timeout(TIMEOUT_S)
    location.forget_listings()
    yield endpoint
    location.set_timeout(location.DEFAULT_TIMEOUT_S)


def _paths():
    return location.as_path(f"s3://{BUCKET}/tree/a.jpg"), location.as_path(f"s3://{BUCKET}/tree")


def _upload(store) -> None:
    """A shard's upload: past the bytes a small request carries, so it is given a longer deadline."""
    with tempfile.TemporaryDirectory() as folder:
        local = Path(folder) / "shard.tfrecord"
        local.write_bytes(b"x" * 200_000)
        store.upload(local, _paths()[0])


OPERATIONS = {
    "read": lambda store: store.read(_paths()[0]),
    "read_many": lambda store: store.read_many([_paths()[0]] * 2, 2),
    "size": lambda store: store.size(_paths()[0]),
    "list": lambda store: store.list(_paths()[1]),
    "range": lambda store: store.request_range(_paths()[0], 0, 10).result(timeout=60),
    "write": lambda store: store.write(_paths()[0], b"x" * 100),
    "upload": lambda store: _upload(store),
    "rename": lambda store: store.rename(_paths()[0], _paths()[0].with_name("b.jpg")),
    "delete": lambda store: store.delete(_paths()[0]),
}


def _timed(operation) -> tuple[BaseException | None, float]:
    """The operation's error and seconds, run on a thread given 60 s (the old rename never ended)."""
    outcome: list = []

    def run() -> None:
        started = time.monotonic()
        try:
            operation()
            outcome.append((None, time.monotonic() - started))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append((exc, time.monotonic() - started))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert outcome, "the operation did not end within 60 s"
    return outcome[0]


@pytest.mark.parametrize("reader", s3_request_plan.READERS)
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_each_operation_on_a_silent_store_ends_within_the_timeout(silent_store, monkeypatch, reader, operation):
    if reader == "s3fs" and operation in ("list", "write", "upload", "rename", "delete"):
        pytest.skip("listings and writes go through obstore whichever reader reads")
    pytest.importorskip("obstore", reason="obstore (the stores extra) is the s3:// client")
    monkeypatch.setenv(s3_request_plan.READER_ENV, reader)
    error, seconds = _timed(lambda: OPERATIONS[operation](S3Store()))
    assert isinstance(error, (StorageError, TimeoutError)), repr(error)
    if isinstance(error, StorageError):
        assert "did not answer" in str(error) and "\n" not in str(error)
        assert str(error).startswith(f"s3://{BUCKET}/tree")
    assert seconds < WITHIN_S, f"{operation} through {reader} took {seconds:.1f} s at a {TIMEOUT_S:.0f} s timeout"


def test_a_silent_store_fails_a_command_in_one_line_within_the_timeout(silent_store, capsys):
    from stallscope.cli.main import main

    started = time.monotonic()
    code = main(["verify", f"s3://{BUCKET}/records", "--storage-timeout", "1"])
    seconds = time.monotonic() - started
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"stallscope verify: error: RECORDS_DIR: s3://{BUCKET}/records: ") and "did not answer" in err
    assert seconds < WITHIN_S


def test_writes_renames_and_deletes_still_reach_a_store_that_answers(s3_env, monkeypatch):
    path = location.as_path(f"s3://{BUCKET}/deadlines/note.json")
    location.write_bytes(path, b'{"ok": true}')  # a write under a temporary name, then a rename
    store = S3Store()
    assert store.read(path) == b'{"ok": true}'
    assert sorted(store.list(location.as_path(f"s3://{BUCKET}/deadlines")).files) == ["note.json"]
    store.delete(path)
    location.forget_listings()
    assert store.list(location.as_path(f"s3://{BUCKET}/deadlines")).files == {}
