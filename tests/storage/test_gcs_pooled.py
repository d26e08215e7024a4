"""gs:// through stallscope's pooled reader (`gcs_reader="pooled"`, obstore): the same bytes as the
folder over kept-alive connections, from the emulated store TF's gs:// also reads; its failures are
one line each, within the storage timeout."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.storage import location
from stallscope.storage.emulator import emulate
from stallscope.storage.location import StorageError

from .conftest import child_environment, free_port

pytestmark = pytest.mark.skipif(importlib.util.find_spec("obstore") is None,
                                reason="obstore (the storage extra) not installed")

LIMIT_S = 120


@pytest.fixture
def gs_store(served, monkeypatch):
    """The emulated GCS store at 2 ms and this process's gs:// readers pointed at it."""
    with emulate(served, kind="gcs", latency_s=0.002, max_duration_s=LIMIT_S) as store:
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        location.set_timeout(10)  # a fresh pooled client, made with this store's proxy and CA
        location.forget_listings()
        yield store
        location.forget_listings()
        location.set_timeout(location.DEFAULT_TIMEOUT_S)


def _gs():
    return location.backend(location.as_path("gs://data"))


def test_pooled_gs_reads_the_folders_bytes_over_kept_alive_connections(served, gs_store):
    names = sorted(p.relative_to(served).as_posix() for p in (served / "tree").rglob("*.jpg"))
    paths = [location.as_path(f"gs://data/{name}") for name in names]
    before = gs_store.counters()
    assert _gs().read_pooled(paths, 4) == [(served / name).read_bytes() for name in names]
    assert _gs().read_pooled(paths, 4) == [(served / name).read_bytes() for name in names]
    after = gs_store.counters()
    assert after.requests - before.requests == 2 * len(paths)  # a GET each, no HEAD before it
    # TF's gs:// opens a connection per request; these 48 GETs, 4 at a time, reuse a few.
    assert 1 <= after.connections - before.connections <= 8


def test_pooled_gs_streams_the_records_tf_reads_locally(served, gs_store, monkeypatch):
    import tensorflow as tf

    from stallscope.storage import tfdata_readers

    monkeypatch.setattr(tfdata_readers, "SHARD_BLOCK_BYTES", 333)  # headers and records across blocks
    for shard in sorted((served / "records").glob("*.tfrecord")):
        local = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
        remote = [r.numpy() for r in tfdata_readers.shard_records(tf.constant(f"gs://data/records/{shard.name}"))]
        assert remote == local and len(local) == 12


def test_a_shard_read_to_its_end_asks_for_the_first_block_of_the_one_its_slot_opens_next(served, gs_store,
                                                                                         monkeypatch):
    """Streamed with the shard after it named, a shard asks for that one's first block once its own last
    block is in; opening that one takes the request instead of making another (a shard switch then
    waits no round trip), and the records are TF's."""
    import tensorflow as tf

    from stallscope.storage import tfdata_readers, shard_heads

    monkeypatch.setattr(tfdata_readers, "SHARD_BLOCK_BYTES", 4096)  # several blocks a shard: the last one counts
    shards = sorted(p for p in location.as_path("gs://data/records").iterdir() if p.name.endswith(".tfrecord"))  # listed: sizes known
    local = [served / "records" / s.name for s in shards]
    assert len(shards) == 2 and all(p.stat().st_size > 3 * 4096 for p in local)
    shard_heads.forget()
    first = [r.numpy() for r in tfdata_readers.shard_records(tf.constant(str(shards[0])), tf.constant(str(shards[1])))]
    assert first == [r.numpy() for r in tf.data.TFRecordDataset(str(local[0]))]
    ahead = shard_heads.take(shards[1], _gs())
    assert ahead is not None and bytes(ahead.result(timeout=10)) == local[1].read_bytes()[:4096]
    assert shard_heads.take(shards[1], _gs()) is None  # taken once

    blocks = sum(-(-p.stat().st_size // 4096) for p in local)
    before = gs_store.counters()
    both = [r.numpy() for r in tfdata_readers.records_dataset([str(s) for s in shards])]
    after = gs_store.counters()
    assert both == [r.numpy() for r in tf.data.TFRecordDataset([str(p) for p in local])]
    assert after.requests - before.requests == blocks  # the second shard's first block asked for once


def test_first_blocks_asked_ahead_are_bounded_and_taken_only_for_the_object_asked_for(served, gs_store):
    """Guesses that never come true (a run stopped early, a slot that opened another shard) hold at most
    HEADS_KEPT first blocks: the oldest are given up. A client made anew (another endpoint or timeout)
    takes none asked through the old one."""
    from stallscope.storage import tfdata_readers, shard_heads

    shard = location.as_path("gs://data/records/train-00000-of-00002.tfrecord")
    location.as_path("gs://data/records").is_dir()  # the folder listed: the shard's size is known
    shard_heads.forget()
    asked = [shard_heads.ask(shard, _gs(), tfdata_readers._first_span) for _ in range(shard_heads.HEADS_KEPT + 3)]  # noqa: SLF001
    assert all(asked)
    taken = [shard_heads.take(shard, _gs()) for _ in range(shard_heads.HEADS_KEPT + 1)]
    assert sum(t is not None for t in taken) == shard_heads.HEADS_KEPT and taken[-1] is None
    assert shard_heads.ask(shard, _gs(), tfdata_readers._first_span)  # noqa: SLF001
    location.set_timeout(10)  # a new client
    assert shard_heads.take(shard, _gs()) is None
    unlisted = location.as_path("gs://data/not-listed.tfrecord")
    assert not shard_heads.ask(unlisted, _gs(), tfdata_readers._first_span)  # noqa: SLF001  (no size: no round trip for one)


def test_tuned_records_in_a_store_repeat_their_shard_list_before_the_reader(served, tmp_path):
    """Training by steps over shards in a store repeats the list of shards, not the records read from
    them, so each epoch's first shards are known, and asked for, while the last ones are read; from
    local disk the records repeat, as before."""
    ran, training = {}, {}
    with emulate(served, kind="gcs", latency_s=0.002, max_duration_s=LIMIT_S) as store:
        try:
            for where, path in (("store", f"{store.url}/records"), ("local", str(served / "records"))):  # side by side
                training[where] = subprocess.Popen(
                    [sys.executable, "-m", "stallscope", "train", "--source", "records", "--dataset_path", path,
                     "--pipeline", "tuned", "--batch-size", "4", "--image-size", "32", "--steps", "18",
                     "--accelerator", "emulated:2000", "--log-path", str(tmp_path / where)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_environment(store.env))
            for where, done in training.items():
                _, err = done.communicate(timeout=LIMIT_S)
                assert done.returncode == 0, err[-3000:]
                ran[where] = json.loads((tmp_path / where / "pipeline.json").read_text())["ran"]
        finally:
            for done in training.values():
                done.kill()
                done.wait()
    def under(stages, upper, lower):  # `lower` sits below `upper` in the chain as run (outermost first)
        return stages.index(upper) < max(i for i, name in enumerate(stages) if name == lower)
    assert under(ran["store"], "ParallelInterleave", "ShuffleAndRepeat"), ran["store"]
    assert "Window" in ran["store"]  # each shard paired with the one its slot reads next
    assert not under(ran["local"], "ParallelInterleave", "ShuffleAndRepeat"), ran["local"]


def test_more_reads_in_flight_than_shards_in_a_store_open_each_shard_once_at_a_time(served, gs_store):
    """An interleave over a repeated list of 2 shards with 8 reads asked for has 2 slots: 8 would open
    the next epochs' copies of the same shards at once, each with its first block."""
    from stallscope.pipeline.builder import build_dataset
    from stallscope.pipeline.presets import get_preset
    from stallscope.pipeline.sources import open_source

    source = open_source("records", "gs://data/records")
    config = get_preset("tuned").replace(batch_size=4, image_size=32, read_parallelism=8)
    stage = build_dataset(config, source, repeat=True)
    while type(stage).__name__ != "_ParallelInterleaveDataset":
        stage = stage._input_dataset  # noqa: SLF001
    assert int(stage._cycle_length) == 2 and int(stage._num_parallel_calls) == 2  # noqa: SLF001
    assert len(list(build_dataset(config, source, repeat=True).take(4))) == 4


@pytest.mark.parametrize("what, path, needle", [
    ("missing bucket", "gs://nope/tree/class_00/img_000.jpg", "bucket 'nope' does not exist"),
    ("missing object", "gs://data/tree/class_00/none.jpg", "no such object"),
])
def test_pooled_gs_failures_name_the_object_in_one_line(gs_store, what, path, needle):
    with pytest.raises(StorageError) as info:
        _gs().read_pooled([location.as_path(path)], 1)
    text = str(info.value)
    assert text.startswith(path) and needle in text and "\n" not in text, what


def test_pooled_gs_without_credentials_says_which_it_looked_for(gs_store, monkeypatch, tmp_path):
    monkeypatch.delenv("GOOGLE_AUTH_TOKEN_FOR_TESTING")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no `gcloud auth application-default login` file
    location.set_timeout(10)
    with pytest.raises(StorageError, match="no credentials for gs://.*GOOGLE_APPLICATION_CREDENTIALS") as info:
        _gs().read_pooled([location.as_path("gs://data/tree/class_00/img_000.jpg")], 1)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("proxy", ["closed", "silent"])
def test_pooled_gs_without_a_reachable_store_is_one_line_not_a_hang(proxy, monkeypatch, tmp_path):
    """Through an HTTPS proxy that refuses (a closed port) or accepts and never answers."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0)) if proxy == "silent" else None
    port = listener.getsockname()[1] if listener else free_port()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "x")
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    location.set_timeout(2)
    started = time.monotonic()
    try:
        expected = "did not answer" if proxy == "silent" else f"the HTTPS proxy at http://127.0.0.1:{port} refused"
        with pytest.raises(StorageError, match=expected) as info:
            _gs().read_pooled([location.as_path("gs://some-bucket/a.jpg")], 1)
    finally:
        location.set_timeout(location.DEFAULT_TIMEOUT_S)
        if listener:
            listener.close()
    assert str(info.value).startswith("gs://some-bucket/a.jpg: ") and "\n" not in str(info.value)
    assert time.monotonic() - started < 30


def _start_train(store, run: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stallscope", "train", "--dataset_path", f"{store.url}/tree", "--pipeline", "tuned",
         "--batch-size", "4", "--image-size", "32", "--accelerator", "emulated:2000", "--log-path", str(run), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment(store.env))


def _finish_train(training: subprocess.Popen, store, run: Path):
    try:
        out, err = training.communicate(timeout=LIMIT_S)
    finally:
        training.kill()
        training.wait()
    assert training.returncode == 0, err[-3000:]
    reader = next(line for line in out.splitlines() if line.startswith("reader"))
    return reader, json.loads((run / "pipeline.json").read_text())["requested"], store.counters()


def _train(store, run: Path, *flags: str):
    return _finish_train(_start_train(store, run, *flags), store, run)


def test_tuned_reads_gs_jpegs_through_the_pooled_reader_and_tf_on_request(served, tmp_path):
    """`tuned` fetches gs:// JPEGs in groups, 128 in flight, and says so on its reader line;
    `--gcs-reader tf` keeps TF's own client, 32 reads in flight on a private pool. The two runs go side
    by side, each on a store of its own (most of a run is TF's start-up)."""
    with emulate(served, kind="gcs", latency_s=0.002, max_duration_s=LIMIT_S) as pooled_store, \
            emulate(served, kind="gcs", latency_s=0.002, max_duration_s=LIMIT_S) as tf_store:
        runs = [(_start_train(pooled_store, tmp_path / "pooled", "--steps", "4"), pooled_store, tmp_path / "pooled")]
        try:
            runs.append((_start_train(tf_store, tmp_path / "tf", "--gcs-reader", "tf", "--steps", "4"), tf_store,
                         tmp_path / "tf"))
            (pooled_reader, pooled_requested, _), (reader, requested, counted) = [_finish_train(*run) for run in runs]
        finally:
            for training, _, _ in runs:
                training.kill()
                training.wait()
    assert pooled_reader.endswith("obstore on gs:// (128 in flight)"), pooled_reader
    assert pooled_requested["gcs_reader"] == "pooled" and pooled_requested["read_parallelism"] == 128
    assert "TF gs:// (32 reads in flight on a private pool of " in reader, reader
    assert requested["gcs_reader"] == "tf" and requested["read_parallelism"] == 32
    assert counted.connections >= counted.requests - counted.lists  # a connection per request


def test_the_pooled_reader_keeps_its_connections_across_epochs(served, tmp_path):
    """Five passes over 24 JPEGs, 8 in flight: ~120 GETs over at most 8 connections of its own (the
    run's listing goes through TF's gs://, a connection per request)."""
    with emulate(served, kind="gcs", latency_s=0.002, max_duration_s=LIMIT_S) as store:
        _, requested, counted = _train(store, tmp_path / "run", "--read-parallelism", "8", "--steps", "30")
    assert requested["gcs_reader"] == "pooled" and requested["read_parallelism"] == 8
    assert counted.requests - counted.lists >= 120
    assert counted.requests - counted.connections >= 100  # each of the reader's connections served many GETs


def test_convert_from_gs_gives_the_shards_of_the_local_tree_over_kept_alive_connections(image_tree_factory,
                                                                                       tmp_path):
    """convert lists and reads a JPEG tree in gs:// through obstore: the same shards, byte for byte, as
    from the local folder, and its GETs share connections (TF's gs:// opens one each)."""
    tree = image_tree_factory(classes=4, per_class=48)  # 192 JPEGs: 12 chunks of 16, up to 5 fetched at once
    options = ["--shards", "2", "--workers", "2", "--no-progress"]
    local, remote = tmp_path / "local", tmp_path / "remote"
    with emulate(tree.parent, kind="gcs", latency_s=0.002, max_duration_s=LIMIT_S) as store:
        for source, out in ((str(tree), local), (f"{store.url}/{tree.name}", remote)):
            done = subprocess.run([sys.executable, "-m", "stallscope", "convert", source, "--output_path", str(out),
                                   *options], capture_output=True, text=True, timeout=LIMIT_S,
                                  env=child_environment(store.env))
            assert done.returncode == 0, done.stderr[-3000:]
        counted = store.counters()
    shards = {p.name: p.read_bytes() for p in sorted(local.glob("*.tfrecord"))}
    assert len(shards) == 2 and shards == {p.name: p.read_bytes() for p in sorted(remote.glob("*.tfrecord"))}
    assert json.loads((remote / "manifest.json").read_text())["source"] == f"{store.url}/{tree.name}"
    # Through TF's gs:// requests == connections. A chunk's GETs go out at once, each on a connection
    # (up to 80 at a time), and later chunks reuse them.
    assert counted.requests - counted.connections >= 64, counted


def test_a_gs_listing_is_one_paged_request_a_folder_with_every_size(served, gs_store):
    """TF's client lists names, then asks each object's size (a request and a TLS handshake each);
    the listing through obstore carries the sizes: one request for the tree's top and one for each of
    its 3 folders, for these 24 objects."""
    root = location.as_path("gs://data/tree")
    before = gs_store.counters()
    listing = _gs().list(root)
    after = gs_store.counters()
    local = {p.relative_to(served / "tree").as_posix(): p.stat().st_size for p in (served / "tree").rglob("*.jpg")}
    assert {name: info.size for name, info in listing.files.items()} == local and len(local) == 24
    folders = 1 + len([p for p in (served / "tree").iterdir() if p.is_dir()])
    assert folders == 4 and after.requests - before.requests == folders and after.lists - before.lists == folders
    one = _gs().list(location.as_path("gs://data/tree/class_00/img_000.jpg"))  # an object, not a folder
    assert list(one.files) == [""] and one.files[""].size == local["class_00/img_000.jpg"]
    assert _gs().list(location.as_path("gs://data/nothing-here")).files == {}
    with pytest.raises(StorageError, match="bucket 'nope' does not exist") as info:
        _gs().list(location.as_path("gs://nope/tree"))
    assert "\n" not in str(info.value)


def test_a_store_that_stops_in_the_middle_of_training_through_tfs_gs_is_one_line(served, tmp_path):
    """TF's own gs:// client gives up on a store that went away with an AbortedError after its retries:
    one line naming the object, exit code 2, not a traceback."""
    import select

    with emulate(served, kind="gcs", latency_s=0.01, max_duration_s=LIMIT_S) as store:
        train = subprocess.Popen(
            [sys.executable, "-m", "stallscope", "train", "--dataset_path", f"{store.url}/tree", "--pipeline", "seed",
             "--batch-size", "4", "--image-size", "32", "--steps", "2000", "--accelerator", "emulated:50",
             "--storage-timeout", "2", "--shuffle-buffer", "0", "--log-path", str(tmp_path / "run")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment(store.env))
        try:
            deadline, stepped = time.monotonic() + 60, False
            while not stepped and time.monotonic() < deadline and train.poll() is None:
                if select.select([train.stdout], [], [], 1.0)[0]:
                    stepped = train.stdout.readline().startswith("step ")
            assert stepped, "training never reached its first step line"
        except BaseException:
            train.kill()
            raise
    try:  # the store has stopped: the run must end on its own
        _, err = train.communicate(timeout=LIMIT_S)
    finally:
        train.kill()
    lines = err.strip().splitlines()
    assert train.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith(f"stallscope train: error: --dataset_path: {store.url}/tree/"), lines[-1]
    assert "the store did not answer" in lines[-1]
