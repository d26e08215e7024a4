"""A tree in a bucket is listed folder by folder, several folders at once, and a listing fails only
when the store stops answering: ImageNet train's listing is minutes of pages, each in time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from stallscope.storage import location, obstore_client, paths, s3_request_plan
from stallscope.storage.emulator import emulate
from stallscope.storage.location import StorageError, list_by_folders, with_silence_limit

LIMIT_S = 120


def test_every_folder_is_listed_once_and_several_at_once():
    """A real walk over an in-memory tree of 3 levels: every object once, each folder asked once,
    more than one folder in flight and never more than FOLDERS_IN_FLIGHT."""
    tree = {"": ["a", "b"], "a": [f"a/{i}" for i in range(20)], "b": ["b/x"], "b/x": []}
    tree.update({f"a/{i}": [] for i in range(20)})
    asked: list[str] = []
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def list_folder(prefix: str) -> tuple[list, list[str]]:
        with lock:
            asked.append(prefix)
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.02)  # a request's round trip, so that folders overlap
        with lock:
            in_flight[0] -= 1
        return [f"{prefix}/object"], tree[prefix]

    heard = []
    objects = [o for found in list_by_folders(list_folder, "", lambda: heard.append(1)) for o in found]
    assert sorted(asked) == sorted(tree) and len(asked) == len(tree)
    assert sorted(objects) == sorted(f"{p}/object" for p in tree)
    assert len(heard) == len(tree)
    assert 1 < most[0] <= location.FOLDERS_IN_FLIGHT


def test_a_listing_that_keeps_answering_outlives_the_limit_and_a_silent_one_does_not():
    def answering(heard) -> str:
        # 3 s in all, an answer every 0.1 s: twice the limit of 1.5 s, and never silent for more than a
        # fifteenth of it (a loaded machine that wakes a sleeping thread late is still far inside it)
        for _ in range(30):
            time.sleep(0.1)
            heard()
        return "listed"

    assert with_silence_limit(answering, 1.5, "gs://b/tree") == "listed"
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"gs://b/tree: the store did not answer within 0 s"):
        with_silence_limit(lambda heard: time.sleep(20), 0.3, "gs://b/tree")
    assert time.monotonic() - started < 10  # given up at the limit, not when the call ends (20 s)


@pytest.fixture
def tree(tmp_path) -> Path:
    """12 class folders of 3 small files each, and one file at the top."""
    root = tmp_path / "served" / "tree"
    for c in range(12):
        folder = root / f"class{c:02d}"
        folder.mkdir(parents=True)
        for i in range(3):
            (folder / f"{i}.jpg").write_bytes(b"x" * (c + i + 1))
    (root / "top.txt").write_bytes(b"top")
    return root


@pytest.mark.parametrize("kind, s3_reader", [("gcs", None), ("s3", "obstore")])  # s3fs reads, obstore lists
def test_a_bucket_listing_longer_than_the_limit_that_answers_every_request_in_time(tree, kind, s3_reader, monkeypatch):
    """One folder at a time at 0.15 s a request: 13 listings, about 2 s, against a limit of 1 s on
    silence. A limit on the whole listing failed it."""
    if s3_reader == "obstore" and not obstore_client.installed():
        pytest.skip("obstore (the storage extra) lists s3:// where installed")
    with emulate(tree.parent, kind=kind, latency_s=0.15, max_duration_s=LIMIT_S) as store:
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        if kind == "s3":
            monkeypatch.setenv(s3_request_plan.READER_ENV, s3_reader)
            monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
        location.set_timeout(10)  # fresh clients, made with this endpoint
        root = location.as_path(f"{store.url}/tree")
        # The client made, and its first request answered, before the limit is cut.
        assert (root / "top.txt").read_bytes() == b"top"
        location.forget_listings()
        monkeypatch.setattr(paths, "FOLDERS_IN_FLIGHT", 1)  # where list_by_folders reads it
        monkeypatch.setattr(obstore_client, "deadline", lambda: 1.0)  # a limit on silence
        try:
            started = time.monotonic()
            listed = {p.relative_to(root).as_posix(): p.stat().st_size for p in root.walk_files()}
            took = time.monotonic() - started
            lists = store.counters().lists
        finally:
            location.forget_listings()
            location.set_timeout(location.DEFAULT_TIMEOUT_S)
    assert listed == {p.relative_to(tree).as_posix(): p.stat().st_size for p in tree.rglob("*") if p.is_file()}
    assert lists >= 13 and took > 1.0  # each folder listed on its own, and longer than the limit in all


def test_one_long_answer_is_waited_for_while_the_store_answers_a_probe():
    """A folder of half a million objects is one call of many pages: once the listing has heard an
    answer, a silence asks the probe, and a store that answers it is waited for. A store that stops
    answering the probe too is given up."""
    def listing(heard) -> str:
        heard()  # the top folder's listing
        time.sleep(1.5)  # one large folder: no answer for three times the limit
        return "listed"

    asked = []
    assert with_silence_limit(listing, 0.5, "gs://b/tree", probe=lambda: asked.append(1)) == "listed"
    assert len(asked) >= 2
    with pytest.raises(StorageError, match="did not answer"):
        with_silence_limit(listing, 0.5, "gs://b/tree", probe=lambda: time.sleep(5))
    with pytest.raises(StorageError, match="did not answer"):  # nothing heard yet: no probe
        with_silence_limit(lambda heard: time.sleep(1.5), 0.5, "gs://b/tree", probe=lambda: asked.append(1))


@pytest.mark.parametrize("kind, s3_reader", [("gcs", None), ("s3", "obstore")])  # s3fs reads, obstore lists
def test_a_folder_whose_listing_outlasts_the_limit_is_listed_while_the_store_answers(tmp_path, kind, s3_reader, monkeypatch):
    """6,000 objects in one folder at 0.4 s a request: six pages in one call, past a limit of 2 s (a
    probe on a new connection, as gs:// makes it, takes a CONNECT and a GET: 0.8 s)."""
    if not obstore_client.installed():
        pytest.skip("obstore (the storage extra) lists gs:// and s3:// where installed")
    folder = tmp_path / "served" / "tree" / "big"
    folder.mkdir(parents=True)
    for i in range(6000):
        (folder / f"{i:05d}.jpg").touch()
    with emulate(tmp_path / "served", kind=kind, latency_s=0.4, max_duration_s=LIMIT_S) as store:
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
        if s3_reader:
            monkeypatch.setenv(s3_request_plan.READER_ENV, s3_reader)
        location.set_timeout(10)
        root = location.as_path(f"{store.url}/tree")
        assert (root / "big" / "00000.jpg").read_bytes() == b""  # the client made before the limit is cut
        location.forget_listings()
        monkeypatch.setattr(obstore_client, "deadline", lambda: 2.0)
        try:
            listed = list(root.walk_files())
        finally:
            location.forget_listings()
            location.set_timeout(location.DEFAULT_TIMEOUT_S)
    assert len(listed) == 6000
