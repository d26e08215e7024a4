"""stallscope's readers in a pipeline of your own (`stallscope.list_files`, `read_files`,
`read_records`): the folder's bytes and records from the emulated s3:// and gs:// stores, each label
kept with its file, over kept-alive connections; a missing object fails in a line naming it."""

from __future__ import annotations

import importlib.util

import pytest
import tensorflow as tf

import stallscope
from stallscope.errors import UsageError
from stallscope.storage import location
from stallscope.storage.emulator import emulate

pytestmark = pytest.mark.skipif(importlib.util.find_spec("obstore") is None,
                                reason="obstore (the storage extra) not installed")

LIMIT_S = 120


@pytest.fixture(params=["s3", "gcs"])
def store(request, served, monkeypatch):
    """The emulated store of each kind, serving `served`, with this process's readers pointed at it."""
    with emulate(served, kind=request.param, latency_s=0.002, max_duration_s=LIMIT_S) as emulated:
        for name, value in emulated.env.items():
            monkeypatch.setenv(name, value)
        location.set_timeout(10)  # fresh clients, made with this store's endpoint, proxy and CA
        location.forget_listings()
        yield emulated
        location.forget_listings()
        location.set_timeout(location.DEFAULT_TIMEOUT_S)


def _local_jpegs(served):
    return sorted(p.relative_to(served).as_posix() for p in (served / "tree").rglob("*.jpg"))


def test_list_files_lists_the_tree_as_the_folder_holds_it(served, store):
    listed = stallscope.list_files(f"{store.url}/tree", "*.jpg")
    assert [name[len(store.url) + 1:] for name in listed] == _local_jpegs(served)
    assert stallscope.list_files(f"{store.url}/records", "train-*") == [
        f"{store.url}/records/{p.name}" for p in sorted((served / "records").glob("train-*"))]


def test_read_files_gives_each_files_bytes_with_its_own_label(served, store):
    names = _local_jpegs(served)
    labels = list(range(len(names)))
    dataset = tf.data.Dataset.from_tensor_slices(([f"{store.url}/{n}" for n in names], labels))
    before = store.counters()
    got = list(stallscope.read_files(dataset, in_flight=8).as_numpy_iterator())
    assert [(data, label) for data, label in got] == [((served / n).read_bytes(), i) for i, n in enumerate(names)]
    assert list(stallscope.read_files(dataset, in_flight=8).as_numpy_iterator()) == got
    after = store.counters()
    assert after.requests - before.requests == 2 * len(names)  # one GET each, nothing asked before it
    # Connections kept across requests and passes: TF's gs:// opens one per request (48). About one per
    # request in flight (2 groups of 8); a few more where a request starts before a finished one's
    # connection is back in the pool.
    assert after.connections - before.connections <= len(names)
    only_paths = tf.data.Dataset.from_tensor_slices([f"{store.url}/{n}" for n in names[:3]])
    assert list(stallscope.read_files(only_paths).as_numpy_iterator()) == [(served / n).read_bytes() for n in names[:3]]


def test_read_records_streams_the_records_tfrecorddataset_reads_locally(served, store):
    local = sorted(str(p) for p in (served / "records").glob("*-of-*"))
    expected = list(tf.data.TFRecordDataset(local).as_numpy_iterator())
    remote = [f"{store.url}/records/{p.rsplit('/', 1)[1]}" for p in local]
    assert list(stallscope.read_records(remote).as_numpy_iterator()) == expected
    assert sorted(stallscope.read_records(remote, num_parallel_reads=2).as_numpy_iterator()) == sorted(expected)
    assert list(stallscope.read_records(local).as_numpy_iterator()) == expected  # local: TFRecordDataset itself


def test_a_missing_object_fails_the_iteration_in_a_line_naming_it(store):
    dataset = tf.data.Dataset.from_tensor_slices([f"{store.url}/tree/no-such.jpg"])
    with pytest.raises(tf.errors.OpError, match=r"tree/no-such\.jpg: no such object"):
        list(stallscope.read_files(dataset).as_numpy_iterator())


def test_local_files_read_the_same_way(served):
    names = _local_jpegs(served)[:4]
    dataset = tf.data.Dataset.from_tensor_slices(([str(served / n) for n in names], [0, 1, 2, 3]))
    for in_flight in (1, 2, 64):  # one request at a time, two groups of one, one group of four
        got = list(stallscope.read_files(dataset, in_flight=in_flight).as_numpy_iterator())
        assert got == [((served / n).read_bytes(), i) for i, n in enumerate(names)]
    assert stallscope.list_files(served / "tree", "*.jpg") == [str(served / n) for n in _local_jpegs(served)]


def test_wrong_inputs_are_one_line_each(tmp_path):
    with pytest.raises(UsageError, match="read_files: expected a dataset of path strings"):
        stallscope.read_files(tf.data.Dataset.range(3))
    with pytest.raises(UsageError, match="in_flight: expected 1 or more"):
        stallscope.read_files(tf.data.Dataset.from_tensor_slices(["a"]), in_flight=0)
    with pytest.raises(UsageError, match=r"no-such: expected a folder"):
        stallscope.list_files(tmp_path / "no-such")
    with pytest.raises(UsageError, match="read_records: expected one or more shard paths"):
        stallscope.read_records([])
    with pytest.raises(UsageError, match="expected shards in one kind of place"):
        stallscope.read_records(["s3://data/records/a", str(tmp_path / "b")])


def test_diagnosing_your_own_dataset_measures_the_requests_read_files_made(store):
    """The requests, bytes and times stallscope.read_files asked the store for during the probe: the
    storage figures of a bucket that keeps no counters, and the store as read in the what-if."""
    files = stallscope.list_files(f"{store.url}/tree", "*.jpg")
    labels = [int(f.split("/")[-2].split("_")[-1]) for f in files]

    def decode(jpeg, label):
        return tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (32, 32)), label

    dataset = stallscope.read_files(tf.data.Dataset.from_tensor_slices((files, labels)).repeat(), in_flight=4)
    diagnosis = stallscope.diagnose(dataset.map(decode).batch(4), steps=8, files=files)
    figures = diagnosis.storage
    assert figures is not None and figures.basis == "reader" and figures.read_calls is None
    assert figures.steady_requests == pytest.approx(1.0, rel=0.05)  # one GET per JPEG: per byte received
    assert figures.requests >= figures.steady_requests * 0.95  # per image trained: read-ahead included
    assert 2.0 <= figures.request_ms_median <= figures.request_ms_p90  # the store holds each request 2 ms
    as_read = diagnosis.storage_whatif.scenarios[0]
    assert as_read.scenario.name == "as read" and as_read.named and as_read.scenario.latency_ms < 20.0
    assert "a request took" in diagnosis.text() and "as read (" in diagnosis.text()


def test_the_stores_round_trip_is_timed_with_one_byte_gets_one_at_a_time(served, store):
    """diagnose takes the store's latency from GETs of one byte asked one at a time after the probe (the
    pipeline's own requests wait for busy cores too; TF's client counts none), cycling over the objects."""
    from stallscope.storage.round_trips import time_round_trips

    shards = stallscope.list_files(f"{store.url}/records", "train-*")
    before = store.counters().requests
    timed = time_round_trips(shards, count=10)
    assert timed.requests == 10 and timed.bytes == 10 and store.counters().requests - before == 10
    assert 2.0 <= timed.percentile_ms(0.1) <= timed.percentile_ms(0.5)  # the store holds each request 2 ms
    assert time_round_trips([str(served / "tree")]).requests == 0  # nothing in a store: nothing asked


def test_a_pass_over_records_in_a_store_is_counted_from_the_manifest_beside_them(served, store):
    """stallscope.diagnose's pass length for records in a bucket: the manifest `stallscope convert` wrote
    beside them lists each shard's records, as the store holds them; with no manifest, no count (walking
    the headers would be a request per record)."""
    from stallscope.analysis.dataset_passes import Passes, passes
    from stallscope.records.record_count import count_records

    names = sorted(p.name for p in (served / "records").glob("*-of-*"))
    remote = [f"{store.url}/records/{name}" for name in names]
    assert count_records(remote) == 24
    parse = tf.strings.length
    assert passes(stallscope.read_records(remote).map(parse).shuffle(24).batch(4).repeat()) == Passes(6, 24, True, 24, 24)
    assert passes(stallscope.read_records(remote, num_parallel_reads=2).batch(5).repeat()) == Passes(5)
    if store.kind == "gcs":  # TF's own gs:// client reads them too
        assert passes(tf.data.TFRecordDataset(remote).map(parse).batch(4).repeat()) == Passes(6)
    assert count_records([f"{store.url}/tree/{p.relative_to(served / 'tree').as_posix()}"
                          for p in sorted((served / "tree").rglob("*.jpg"))[:2]]) is None


@pytest.mark.timeout(LIMIT_S)
def test_diagnose_of_your_own_records_in_a_store_reads_them_alone_for_the_model(served, store):
    """As `stallscope diagnose` does for its own workload: a dataset of your own reading shards from a
    bucket gets its records read by one stream with no decode, the chain a parallel decode sits behind,
    shown in the report and the JSON and given to the storage what-if of the store as read."""
    import json

    remote = stallscope.list_files(f"{store.url}/records", "train-*")
    before = store.counters().requests
    dataset = stallscope.read_records(remote).map(tf.strings.length).batch(4).repeat()
    diagnosis = stallscope.diagnose(dataset, steps=6, files=remote)
    reads = diagnosis.reads
    assert reads is not None and reads.records > 0 and reads.ms_per_image > 0, reads
    assert store.counters().requests > before
    assert "records alone" in diagnosis.text()
    assert json.loads(json.dumps(diagnosis.to_dict()))["probes"]["reads_alone"]["records"] == reads.records
    workload = diagnosis.storage_whatif.workload
    assert workload.read_chain == pytest.approx((reads.ms_per_image, reads.cpu_ms_per_image))
