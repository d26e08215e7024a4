"""`stallscope storage probe URL`: a bucket's round trip and transfer measured with no pipeline, against
emulated stores whose latency and bandwidth are known, and its what-if spec."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import time

import pytest

from stallscope.analysis.storage_whatif import parse_scenarios
from stallscope.cli.main import main
from stallscope.storage import location
from stallscope.storage.emulator import emulate

pytestmark = pytest.mark.skipif(importlib.util.find_spec("obstore") is None,
                                reason="obstore (the storage extra) makes and times the requests")

LIMIT_S = 120


def _pointed_at(store, monkeypatch) -> None:
    for name, value in store.env.items():
        monkeypatch.setenv(name, value)
    location.set_timeout(10)  # fresh clients, made with this store's endpoint, proxy and CA
    location.forget_listings()


@pytest.fixture
def large_objects(tmp_path):
    """Four objects of 4 MiB: a transfer of them is bound by bandwidth, not requests."""
    root = tmp_path / "served"
    (root / "shards").mkdir(parents=True)
    for index in range(4):
        (root / "shards" / f"part-{index}").write_bytes(os.urandom(4 << 20))
    return root


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_large_objects_give_the_stores_latency_and_bandwidth(large_objects, monkeypatch, capsys, kind):
    with emulate(large_objects, kind=kind, latency_s=0.005, bandwidth_bps=200e6, max_duration_s=LIMIT_S) as store:
        _pointed_at(store, monkeypatch)
        try:
            assert main(["storage", "probe", f"{store.url}/shards", "--round-trips", "20", "--json"]) == 0
        finally:
            location.forget_listings()
            location.set_timeout(location.DEFAULT_TIMEOUT_S)
    result = json.loads(capsys.readouterr().out)
    assert result["objects"] == 4 and result["bytes_read"] == 4 * (4 << 20) and result["round_trips"] == 20
    assert 5.0 <= result["round_trip_ms"]["p10"] <= result["round_trip_ms"]["p50"]
    assert 4.0 <= result["latency_ms"] <= 12.0  # the emulator holds each request 5 ms
    assert result["bandwidth_bytes_per_s"] == pytest.approx(25e6, rel=0.35)  # 200 Mbit/s, shared
    scenario = parse_scenarios(result["what_if_storage"])[0]  # the spec is one diagnose takes
    assert scenario.latency_ms == result["latency_ms"]
    assert scenario.bandwidth_bytes_per_s == pytest.approx(result["bandwidth_bytes_per_s"], rel=0.01)


def test_small_objects_are_bound_by_requests_and_name_no_bandwidth(served, monkeypatch, capsys):
    with emulate(served, kind="s3", latency_s=0.002, max_duration_s=LIMIT_S) as store:
        _pointed_at(store, monkeypatch)
        try:
            before = store.counters().requests
            assert main(["storage", "probe", f"{store.url}/tree", "--in-flight", "4"]) == 0
            asked = store.counters().requests - before
        finally:
            location.forget_listings()
            location.set_timeout(location.DEFAULT_TIMEOUT_S)
    out = capsys.readouterr().out
    assert "round trip   24 one-byte GETs, one at a time: fastest tenth" in out
    assert "4 in flight, 24 objects (largest first" in out and "bound by requests, not bandwidth" in out
    assert "--what-if-storage " in out and ",unlimited" in out
    assert asked >= 24 + 24  # the round trips, then every object once (and the listing)


def test_wrong_urls_and_dead_stores_are_one_line(tmp_path, monkeypatch, capsys):
    assert main(["storage", "probe", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "URL: expected gs://bucket/prefix or s3://bucket/prefix" in err
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    for name, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
                        "AWS_SECRET_ACCESS_KEY": "test", "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                        "AWS_CONFIG_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    location.forget_listings()
    started = time.monotonic()
    try:
        assert main(["storage", "probe", "s3://data/tree", "--storage-timeout", "2"]) == 2
    finally:
        location.set_timeout(location.DEFAULT_TIMEOUT_S)
    err = capsys.readouterr().err.strip()
    # nothing listens at the port: refused at once, and the line says a longer timeout cannot help
    assert len(err.splitlines()) == 1 and "refused the connection" in err and time.monotonic() - started < 30


def test_diagnose_times_the_bandwidth_of_large_objects_in_blocks(large_objects, monkeypatch):
    """For shards, diagnose's store as read has a bandwidth: ranged GETs of 4 MiB blocks, several at
    once, with each wave's round trip taken out; for small objects, none."""
    from stallscope.storage.round_trips import time_store

    with emulate(large_objects, kind="s3", latency_s=0.005, bandwidth_bps=200e6, max_duration_s=LIMIT_S) as store:
        _pointed_at(store, monkeypatch)
        try:
            shards = [str(p) for p in location.as_path(f"{store.url}/shards").walk_files()]
            before = store.counters().bytes
            trips, bandwidth = time_store(shards)
            sent = store.counters().bytes - before
        finally:
            location.forget_listings()
            location.set_timeout(location.DEFAULT_TIMEOUT_S)
    assert trips.requests == 24 and bandwidth == pytest.approx(25e6, rel=0.35)  # 200 Mbit/s
    assert sent <= 4 * (4 << 20) + (64 << 10)  # the four blocks (and the round trips' bytes), nothing more


def test_small_objects_get_no_bandwidth(served, monkeypatch):
    from stallscope.storage.round_trips import time_store

    with emulate(served, kind="s3", latency_s=0.002, max_duration_s=LIMIT_S) as store:
        _pointed_at(store, monkeypatch)
        try:
            trips, bandwidth = time_store([str(p) for p in location.as_path(f"{store.url}/tree").walk_files()])
        finally:
            location.forget_listings()
            location.set_timeout(location.DEFAULT_TIMEOUT_S)
    assert trips.requests == 24 and bandwidth is None
