"""The storage emulator (`stallscope storage serve`, `storage.emulator.emulate`): a local folder as a
gs:// or s3:// bucket on loopback, read by the real clients (TF's own gs://, obstore, s3fs), with the latency
really applied and the counters `diagnose --storage-counters` reads."""

from __future__ import annotations

import hashlib
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.analysis.storage_counters import load_storage_counters
from stallscope.cli.main import main
from stallscope.errors import UsageError
from stallscope.storage import location, s3_request_plan
from stallscope.storage.emulator import emulate

from .conftest import child_environment

LIMIT_S = 120  # every child here is bounded


def digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


TF_READS_GS = """
import hashlib, json, sys
import tensorflow as tf
url = sys.argv[1]
files = sorted(tf.io.gfile.glob(url + "/tree/*/*"))
tree = {f[len(url) + 1:]: hashlib.sha256(tf.io.gfile.GFile(f, "rb").read()).hexdigest() for f in files}
shards = sorted(tf.io.gfile.glob(url + "/records/*.tfrecord*"))
records = sum(1 for _ in tf.data.TFRecordDataset(shards))
print(json.dumps({"tree": tree, "records": records, "shards": len(shards)}))
"""


def test_gs_through_tf_reads_the_same_bytes_as_the_folder(served):
    with emulate(served, kind="gcs", latency_s=0.002, max_duration_s=LIMIT_S) as store:
        assert store.url == "gs://data" and store.env["CURL_CA_BUNDLE"] and store.env["NO_GCE_CHECK"] == "true"
        done = subprocess.run([sys.executable, "-c", TF_READS_GS, store.url], capture_output=True, text=True,
                              timeout=LIMIT_S, env=child_environment(store.env | {"GCS_READ_CACHE_BLOCK_SIZE_MB": "1"}))
        assert done.returncode == 0, done.stderr[-3000:]
        read = json.loads(done.stdout.strip().splitlines()[-1])
        counted = store.counters()
    local = digests(served)
    assert read["tree"] == {k: v for k, v in local.items() if k.startswith("tree/")} and len(read["tree"]) == 24
    assert read["records"] == 24 and read["shards"] == 2
    assert counted.requests >= 24 + 2 and counted.lists >= 2 and counted.errors == 0
    assert counted.bytes >= sum((served / "tree" / k[5:]).stat().st_size for k in read["tree"])
    assert counted.connections >= 1


@pytest.fixture
def s3_emulated(served, monkeypatch):
    """An emulated S3 store at 2 ms per request and this process's s3:// reader pointed at it."""
    with emulate(served, kind="s3", latency_s=0.002, max_duration_s=LIMIT_S) as store:
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
        location.set_timeout(10)  # a fresh client, made with this endpoint
        location.forget_listings()
        yield store
        location.forget_listings()
        location.set_timeout(location.DEFAULT_TIMEOUT_S)


def test_s3_through_the_s3_reader_reads_the_same_bytes_as_the_folder(served, s3_emulated):
    root = location.as_path(f"{s3_emulated.url}/tree")
    files = sorted(root.walk_files(), key=str)
    read = {f"tree/{str(p)[len(str(root)) + 1:]}": hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    local = digests(served)
    assert read == {k: v for k, v in local.items() if k.startswith("tree/")} and len(read) == 24
    counted = s3_emulated.counters()
    assert counted.requests >= 24 and counted.lists >= 1 and counted.errors == 0
    assert counted.bytes >= sum((served / k).stat().st_size for k in read)


def test_the_s3_reader_reads_each_object_with_one_request_and_keeps_one_listing(served, s3_emulated):
    root = location.as_path(f"{s3_emulated.url}/tree")
    local = sorted(p.relative_to(served / "tree").as_posix() for p in (served / "tree").rglob("*") if p.is_file())
    files = [root / name for name in local]  # named, not listed: nothing known of them before the reads
    before = s3_emulated.counters().requests
    assert location.read_many(files, 8) == [(served / "tree" / name).read_bytes() for name in local]
    assert s3_emulated.counters().requests - before == len(files)  # a GET each, no HEAD before it
    assert sorted(p.relative_to(root).as_posix() for p in root.walk_files()) == local


def _records(dataset) -> list[bytes]:
    return [record.numpy() for record in dataset]


READERS = [pytest.param("obstore", marks=pytest.mark.skipif(importlib.util.find_spec("obstore") is None,
                                                             reason="obstore (the storage extra) not installed")),
           "s3fs"]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("block_bytes", [333, 16 * 1024 * 1024])  # headers and records across blocks; one block
def test_s3_shards_stream_the_records_tf_reads_locally(served, s3_emulated, monkeypatch, block_bytes, reader):
    import tensorflow as tf

    from stallscope.storage import tfdata_readers

    monkeypatch.setenv(s3_request_plan.READER_ENV, reader)

    monkeypatch.setattr(tfdata_readers, "GROUP_RECORDS", 5)  # 12 records a shard: groups of 5, 5 and 2
    monkeypatch.setattr(tfdata_readers, "SHARD_BLOCK_BYTES", block_bytes)
    for shard in sorted((served / "records").glob("*.tfrecord")):
        local = _records(tf.data.TFRecordDataset(str(shard)))
        remote = _records(tfdata_readers.shard_records(tf.constant(f"{s3_emulated.url}/records/{shard.name}")))
        assert remote == local and len(local) == 12


@pytest.fixture(params=READERS)
def shard_in_small_blocks(request, served, s3_emulated, monkeypatch):
    """(the first local shard, its s3:// path), read by each s3:// reader in blocks of 333 bytes."""
    from stallscope.storage import tfdata_readers

    monkeypatch.setenv(s3_request_plan.READER_ENV, request.param)
    monkeypatch.setattr(tfdata_readers, "SHARD_BLOCK_BYTES", 333)
    shard = sorted((served / "records").glob("*.tfrecord"))[0]
    return shard, location.as_path(f"{s3_emulated.url}/records/{shard.name}")


def test_the_s3_shard_reader_asks_for_the_next_block_while_one_is_parsed(shard_in_small_blocks, s3_emulated):
    from stallscope.storage import tfdata_readers

    shard, path = shard_in_small_blocks
    before = s3_emulated.counters().requests
    blocks = tfdata_readers._blocks(path, tfdata_readers.backend(path))
    try:
        assert next(blocks) == shard.read_bytes()[:333]
        waited = time.monotonic() + LIMIT_S
        while s3_emulated.counters().requests - before < 3 and time.monotonic() < waited:
            time.sleep(0.05)
        time.sleep(0.2)  # room for a request too many to show up
        assert s3_emulated.counters().requests - before == 3  # its size, the first block, the next one only
    finally:
        blocks.close()


def test_a_shards_first_block_is_asked_for_alone(shard_in_small_blocks, monkeypatch):
    """Asked for beside the next block, the first would share the link with bytes nobody waits for yet."""
    from stallscope.storage import tfdata_readers

    shard, path = shard_in_small_blocks
    store = tfdata_readers.backend(path)
    asked: list[tuple[int, bool]] = []  # (start, whether every earlier request had its bytes)
    futures = []
    real_request = store.request_range

    def request_range(where, start, end):
        asked.append((start, all(f.done() for f in futures)))
        futures.append(real_request(where, start, end))
        return futures[-1]

    monkeypatch.setattr(store, "request_range", request_range)
    blocks = tfdata_readers._blocks(path, store)
    try:
        assert b"".join(blocks) == shard.read_bytes()
    finally:
        blocks.close()
    assert [start for start, _ in asked][:3] == [0, 333, 666]
    assert asked[1][1], "the second block was asked for before the first had arrived"


def test_a_shard_is_read_in_a_small_first_block_then_full_ones(monkeypatch):
    from stallscope.storage import tfdata_readers

    monkeypatch.setattr(tfdata_readers, "FIRST_BLOCK_BYTES", 4)
    monkeypatch.setattr(tfdata_readers, "SHARD_BLOCK_BYTES", 16)
    assert tfdata_readers.block_spans(0) == []
    assert tfdata_readers.block_spans(3) == [(0, 3)]
    assert tfdata_readers.block_spans(20) == [(0, 4), (4, 20)]
    assert tfdata_readers.block_spans(45) == [(0, 4), (4, 20), (20, 36), (36, 45)]
    monkeypatch.setattr(tfdata_readers, "SHARD_BLOCK_BYTES", 2)  # never a first block larger than the others
    assert tfdata_readers.block_spans(5) == [(0, 2), (2, 4), (4, 5)]


@pytest.mark.parametrize("reader", READERS)
def test_a_shards_size_comes_from_the_listing_this_process_holds(served, s3_emulated, monkeypatch, reader):
    """A listing this process holds saves the size's round trip (a HEAD) at every shard's opening."""
    from stallscope.storage import tfdata_readers

    monkeypatch.setenv(s3_request_plan.READER_ENV, reader)
    monkeypatch.setattr(tfdata_readers, "SHARD_BLOCK_BYTES", 333)
    shard = sorted((served / "records").glob("*.tfrecord"))[0]
    listed = {p.name: p for p in location.as_path(f"{s3_emulated.url}/records").walk_files()}  # as a run plans
    path = listed[shard.name]
    before = s3_emulated.counters().requests
    blocks = tfdata_readers._blocks(path, tfdata_readers.backend(path))
    try:
        assert next(blocks) == shard.read_bytes()[:333]
        waited = time.monotonic() + LIMIT_S
        while s3_emulated.counters().requests - before < 2 and time.monotonic() < waited:
            time.sleep(0.05)
        time.sleep(0.2)  # room for a request too many to show up
        assert s3_emulated.counters().requests - before == 2  # the two blocks; no HEAD
    finally:
        blocks.close()


@pytest.mark.parametrize("reader", READERS)
def test_a_damaged_s3_shard_gives_its_records_up_to_the_damage_then_fails(served, s3_emulated, monkeypatch, reader):
    import tensorflow as tf

    from stallscope.storage import tfdata_readers

    monkeypatch.setenv(s3_request_plan.READER_ENV, reader)

    monkeypatch.setattr(tfdata_readers, "GROUP_RECORDS", 5)
    monkeypatch.setattr(tfdata_readers, "SHARD_BLOCK_BYTES", 333)
    shard = sorted((served / "records").glob("*.tfrecord"))[0]
    local = _records(tf.data.TFRecordDataset(str(shard)))
    damaged = bytearray(shard.read_bytes())
    eighth = sum(12 + len(record) + 4 for record in local[:7])  # header 12, payload, footer 4
    damaged[eighth + 12 + 10] ^= 0xFF  # inside the eighth record's payload
    folder = served / f"damaged-{reader}"
    folder.mkdir()
    try:
        (folder / shard.name).write_bytes(bytes(damaged))
        got = []
        with pytest.raises(tf.errors.OpError, match=f"{folder.name}/{shard.name}: corrupted record at byte {eighth}"):
            for record in tfdata_readers.shard_records(tf.constant(f"{s3_emulated.url}/{folder.name}/{shard.name}")):
                got.append(record.numpy())
        assert got == local[:7]  # as TFRecordDataset: every record before the damaged one
    finally:
        shutil.rmtree(folder)


def test_the_pipeline_trains_from_the_emulated_s3_bucket(s3_emulated, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--source", "records", "--dataset_path", f"{s3_emulated.url}/records", "--steps", "3",
                 "--pipeline", "tuned", "--log_path", str(run_dir), "--image_size", "32", "--batch_size", "4",
                 "--shuffle-buffer", "8", "--accelerator", "emulated:1ms"])
    assert code == 0, capsys.readouterr().err
    assert json.loads((run_dir / "summary.json").read_text())["last_step"] == 3


def _get(connection: http.client.HTTPConnection, path: str) -> bytes:
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    assert response.status == 200, (path, response.status, body[:200])
    return body


# The S3 server waits out the latency itself (a timer on its event loop); a bandwidth cap (here one that never binds)
# puts the latency proxy in front instead.
BY_THE_SERVER, BY_THE_PROXY = None, 10e9


@pytest.mark.parametrize("bandwidth", [BY_THE_SERVER, BY_THE_PROXY], ids=["server", "proxy"])
def test_latency_is_paid_by_every_request_and_counted(served, tmp_path, bandwidth):
    """8 sequential requests on one kept-alive connection at 50 ms each take at least 8 x 50 ms: a
    lower bound, which no speed of this machine can pass without the latency."""
    counters_file = tmp_path / "counters.json"
    with emulate(served, kind="s3", latency_s=0.05, bandwidth_bps=bandwidth, counters_path=counters_file,
                 max_duration_s=LIMIT_S) as store:
        assert (store.server_port == store.port) == (bandwidth is BY_THE_SERVER)
        connection = http.client.HTTPConnection("127.0.0.1", store.port, timeout=10)
        key = "tree/class_00/img_000.jpg"
        started = time.monotonic()
        bodies = [_get(connection, f"/data/{key}") for _ in range(8)]
        elapsed = time.monotonic() - started
        connection.close()
        live = store.counters()
    assert elapsed >= 8 * 0.05
    assert all(body == (served / key).read_bytes() for body in bodies)
    size = (served / key).stat().st_size
    assert (live.requests, live.connections, live.bytes) == (8, 1, 8 * size)
    from_file = load_storage_counters(counters_file)  # the shape `diagnose --storage-counters` reads
    assert (from_file.requests, from_file.connections, from_file.bytes) == (8, 1, 8 * size)


@pytest.mark.parametrize("bandwidth", [BY_THE_SERVER, BY_THE_PROXY], ids=["server", "proxy"])
def test_a_gs_tunnel_pays_its_connect_and_handshake_and_then_one_round_trip_a_request(served, tmp_path, bandwidth):
    """TF's gs:// reaches the store through `CONNECT storage.googleapis.com:443` and TLS with the
    emulator's CA. At 50 ms a request, a new tunnel's first GET waits for the CONNECT, the handshake's
    flight and itself (at least 3 latencies, whoever holds them: the server, or the relay in front of
    it); a second GET on the same tunnel waits once."""
    import ssl

    latency = 0.05
    key = "tree/class_00/img_000.jpg"
    counters_file = tmp_path / "counters.json"
    with emulate(served, kind="gcs", latency_s=latency, bandwidth_bps=bandwidth, counters_path=counters_file,
                 max_duration_s=LIMIT_S) as store:
        assert (store.server_port == store.port) == (bandwidth is BY_THE_SERVER)
        trusted = ssl.create_default_context(cafile=store.env["CURL_CA_BUNDLE"])
        firsts, seconds = [], []
        for _ in range(3):
            tunnel = http.client.HTTPSConnection("127.0.0.1", store.port, timeout=10, context=trusted)
            tunnel.set_tunnel("storage.googleapis.com", 443)
            for took in (firsts, seconds):
                started = time.monotonic()
                assert _get(tunnel, f"/data/{key}") == (served / key).read_bytes()
                took.append(time.monotonic() - started)
            tunnel.close()
        live = store.counters()
    assert min(firsts) >= 3 * latency
    assert min(seconds) >= latency
    assert all(second < first - latency for first, second in zip(firsts, seconds)), (firsts, seconds)
    assert (live.requests, live.connections) == (6, 3)


def test_the_latency_proxy_adds_its_latency_and_no_more(served):
    """Small answers through a 1 ms proxy: a body shorter than one TCP segment must not wait for the
    ack of its headers (Nagle's algorithm against delayed acks holds it 40 ms on Linux, which the
    proxy's accepted sockets did when asyncio left TCP_NODELAY off them). The median of 30 requests,
    so that a busy machine's odd slow one does not count."""
    key = "tree/class_00/img_000.jpg"
    with emulate(served, kind="s3", latency_s=0.001, bandwidth_bps=BY_THE_PROXY, max_duration_s=LIMIT_S) as store:
        connection = http.client.HTTPConnection("127.0.0.1", store.port, timeout=10)
        _get(connection, f"/data/{key}")
        took = []
        for _ in range(30):
            started = time.monotonic()
            assert _get(connection, f"/data/{key}") == (served / key).read_bytes()
            took.append(time.monotonic() - started)
        connection.close()
    assert sorted(took)[len(took) // 2] < 0.025, sorted(took)


def test_bandwidth_cap_is_shared(served):
    """200 kbit/s for ~50 KB: at least 2 s (a lower bound again)."""
    key = "records/" + sorted(p.name for p in (served / "records").glob("*.tfrecord*"))[0]
    size = (served / key).stat().st_size
    with emulate(served, kind="s3", bandwidth_bps=200e3, max_duration_s=LIMIT_S) as store:
        connection = http.client.HTTPConnection("127.0.0.1", store.port, timeout=30)
        started = time.monotonic()
        body = _get(connection, f"/data/{key}")
        elapsed = time.monotonic() - started
        connection.close()
    assert body == (served / key).read_bytes()
    assert elapsed >= size * 8 / 200e3 * 0.9


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])  # SIGINT: Ctrl-C
def test_a_signal_ends_the_store_cleanly_with_final_counters(served, tmp_path, stop_signal):
    ready, counters_file = tmp_path / "ready.json", tmp_path / "counters.json"
    process = subprocess.Popen([sys.executable, "-m", "stallscope", "storage", "serve", str(served), "--s3",
                                "--latency", "1ms", "--for", "60s", "--ready-file", str(ready),
                                "--counters", str(counters_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment())
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert info["url"] == "s3://data" and info["pid"] == process.pid
        connection = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=10)
        _get(connection, "/data/tree/class_01/img_002.jpg")
        connection.close()
        os.kill(process.pid, stop_signal)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
    assert process.returncode == 0, err
    assert f"export AWS_ENDPOINT_URL=http://127.0.0.1:{info['port']}" in out and "s3://data" in out
    assert "Traceback" not in err and "stopped: 1 requests" in err
    assert load_storage_counters(counters_file).requests == 1
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", info["port"]), timeout=2).close()


def test_serve_prints_the_gcs_environment_and_stops_by_itself(served):
    done = subprocess.run([sys.executable, "-m", "stallscope", "storage", "serve", str(served), "--gcs",
                           "--latency", "10ms", "--bandwidth", "200Mbit", "--for", "1s"],
                          capture_output=True, text=True, timeout=LIMIT_S, env=child_environment())
    assert done.returncode == 0, done.stderr
    for name in ("HTTPS_PROXY", "CURL_CA_BUNDLE", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "NO_GCE_CHECK"):
        assert f"export {name}=" in done.stdout
    assert "GCS_READ_CACHE_BLOCK_SIZE_MB=1" in done.stdout and "gs://data" in done.stdout
    assert "10ms per request" in done.stdout and "200Mbit" in done.stdout


@pytest.mark.parametrize("latency", ["0", "5ms"])  # the store itself, or the latency proxy in front of it
def test_a_port_in_use_is_one_line(served, latency):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "stallscope", "storage", "serve", str(served), "--s3",
                               "--latency", latency, "--port", str(port), "--for", "5s"],
                              capture_output=True, text=True, timeout=LIMIT_S, env=child_environment())
        with pytest.raises(UsageError, match="--port"):
            with emulate(served, kind="s3", port=port, max_duration_s=10):
                pass
    assert done.returncode == 2
    assert done.stderr.strip() == (f"stallscope storage: error: --port: expected a free port on 127.0.0.1, "
                                   f"got {port} (in use)")


@pytest.mark.parametrize("args, needle", [
    (["storage", "serve", "{missing}", "--s3"], "DIR: expected an existing folder to serve"),
    (["storage", "serve", "{served}", "--latency", "soon"], "--latency: expected a latency such as 10ms"),
    (["storage", "serve", "{served}", "--bandwidth", "fast"], "--bandwidth: expected a bandwidth above 0"),
    (["storage", "serve", "{served}", "--counters", "{served}"], "--counters: expected a file to write"),
    (["storage", "serve", "{served}", "--mount", "{served}/tree"], "--mount: expected an empty folder"),
])
def test_bad_input_is_one_line_with_exit_2(served, tmp_path, capsys, args, needle):
    argv = [a.format(served=served, missing=tmp_path / "missing") for a in args]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors (flag types)
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.skipif(importlib.util.find_spec("obstore") is None, reason="obstore (the storage extra) not installed")
def test_diagnose_on_a_bucket_without_counters_measures_what_its_reader_asked_for(served):
    """A real bucket keeps no counters file: stallscope's reader counts its own requests, their bytes and
    times, and the what-if gains the store as read (its latency from one-byte GETs timed one at a
    time), on which the storage advice is given without a store named. The page cache has nothing of a store's data,
    so no cold probe runs, and no local I/O figure is shown as the store's."""
    with emulate(served, kind="s3", latency_s=0.01, max_duration_s=LIMIT_S * 2) as store:
        done = subprocess.run(
            [sys.executable, "-m", "stallscope", "diagnose", "--dataset_path", f"{store.url}/tree", "--pipeline", "seed",
             "--batch-size", "4", "--image-size", "32", "--accelerator", "emulated:2000", "--probe-steps", "4",
             "--pipeline-budget", "2", "--json"],
            capture_output=True, text=True, timeout=LIMIT_S * 2, env=child_environment(store.env))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    storage = report["storage"]
    assert storage["basis"] == "reader" and storage["client"] == "obstore"
    assert storage["steady_requests"] == pytest.approx(1.0, rel=0.05)  # one GET per JPEG, read one at a time
    assert storage["requests"] >= storage["steady_requests"] * 0.95  # per image trained: read-ahead included
    assert storage["read_calls"] is None and report["probes"]["cold"] is None
    assert 10.0 <= storage["request_ms_median"] <= storage["request_ms_p90"]
    assert any(note.startswith("cold page cache not probed: the data is in a store") for note in report["notes"])
    as_read = report["storage_what_if"]["scenarios"][0]
    assert as_read["scenario"]["name"] == "as read" and as_read["named"]
    assert 8.0 <= as_read["scenario"]["latency_ms"] <= 15.0  # the emulator holds each request 10 ms
    assert {"convert_records", "reads_in_flight"} <= {a["key"] for a in report["advice"]}


def test_diagnose_on_the_emulated_gs_bucket_measures_requests_per_image(served, tmp_path):
    """End to end: TF's gs:// reads the JPEG tree through the emulator at 10 ms, and diagnose takes
    the requests per image from the store's own counters file, not from its model."""
    counters_file = tmp_path / "counters.json"
    with emulate(served, kind="gcs", latency_s=0.01, counters_path=counters_file, max_duration_s=LIMIT_S * 2) as store:
        done = subprocess.run(
            [sys.executable, "-m", "stallscope", "diagnose", "--dataset_path", f"{store.url}/tree", "--pipeline", "seed",
             "--batch-size", "4", "--image-size", "32", "--accelerator", "emulated:2000", "--probe-steps", "4",
             "--pipeline-budget", "2", "--no-cold-cache", "--storage-counters", str(counters_file), "--json"],
            capture_output=True, text=True, timeout=LIMIT_S * 2, env=child_environment(store.env))
        served_requests = store.counters().requests
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    storage = report["storage"]
    assert storage["basis"] == "measured" and storage["client"] == "tf-gcs"
    # one ranged GET per JPEG (1 MB blocks), plus a share of the listings and the shuffle's refills
    assert 1.0 <= storage["requests"] < 2.0 and storage["connections"] > 0
    assert served_requests >= 24 and report["source"]["path"] == "gs://data/tree"
    if importlib.util.find_spec("obstore") is not None:
        # TF's client counts nothing stallscope sees; the store's latency comes from GETs timed after the probe
        as_read = report["storage_what_if"]["scenarios"][0]["scenario"]
        assert as_read["name"] == "as read" and "small GETs, one at a time" in as_read["meaning"]
        assert 8.0 <= as_read["latency_ms"] <= 15.0


def test_a_store_port_left_in_time_wait_can_be_served_again_and_a_listening_one_cannot():
    """A store stopped with clients connected leaves its closed connections in TIME-WAIT for a minute;
    its port must take a new store at once, while a port another store listens on still fails."""
    import errno
    import socket

    from stallscope.storage.emulator.http_handler import listening_socket

    first = listening_socket(0)
    port = first.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    accepted, _ = first.accept()
    accepted.close()  # the store closes first: its side of the connection waits in TIME-WAIT
    client.close()
    first.close()
    again = listening_socket(port)
    try:
        with pytest.raises(OSError) as taken:
            listening_socket(port)
        assert taken.value.errno == errno.EADDRINUSE
    finally:
        again.close()
