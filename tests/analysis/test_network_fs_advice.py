"""Data on a network file system (here the emulator's FUSE mount): recognised, its round trip measured,
modelled as POSIX opens and reads, and `tuned` / `diagnose --fix` keep reads in flight on it."""

from __future__ import annotations

import dataclasses

import json
import math
import os

import pytest

from stallscope.analysis import differential, fix_loop
from stallscope.analysis import storage_whatif as sw
from stallscope.analysis.advice import Advice
from stallscope.analysis.differential import PipelineBreakdown, attribute
from stallscope.cli.main import main
from stallscope.config import AUTOTUNE
from stallscope.cpu_limits import CpuLimits
from stallscope.pipeline import presets
from stallscope.pipeline.presets import get_preset
from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.fuse_mount import why_no_fuse
from stallscope.storage.under import storage_under, time_file_round_trips

from .conftest import loop_probe

WHY_NO_FUSE = why_no_fuse()
needs_fuse = pytest.mark.skipif(bool(WHY_NO_FUSE), reason=f"needs a FUSE mount: {WHY_NO_FUSE}")
LATENCY_S = 0.01
LIMIT_S = 300


@pytest.fixture
def mounted(tiny_tree, tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    with emulate(tiny_tree, kind="mount", mount_point=mount, latency_s=LATENCY_S, max_duration_s=LIMIT_S):
        yield mount


@needs_fuse
def test_the_mount_is_named_and_one_open_and_read_costs_two_round_trips(mounted, tiny_tree):
    under = storage_under(mounted)
    assert (under.kind, under.fstype, under.label, under.remote) == ("network-fs", "fuse", "fuse mount", True)
    local = storage_under(tiny_tree)
    assert (local.kind, local.label, local.remote) == ("local", "local disk", False)
    assert storage_under("gs://bucket/x").label == "gs:// bucket"
    files = sorted(str(p) for p in mounted.rglob("*.jpg"))
    trips = time_file_round_trips(files, count=8)
    assert trips.count == 8
    # the emulator waits its latency on every open and every read: two round trips, never fewer
    assert 2 * LATENCY_S * 1000 <= trips.open_and_read_ms < 2 * LATENCY_S * 1000 + 40
    assert trips.open_ms >= LATENCY_S * 1000 and trips.read_ms >= LATENCY_S * 1000


def test_tuned_on_a_network_file_system_keeps_the_round_trip_times_the_decode_rate_in_flight():
    tuned, two = get_preset("tuned"), CpuLimits(cpus=(0, 1), quota_cores=None)
    local = presets.tuned_for_store(tuned, "files", "file", two)
    assert local.read_parallelism == AUTOTUNE and local.private_threadpool_size == 0
    at_20ms = presets.tuned_for_store(tuned, "files", presets.NETWORK_FS, two, round_trip_ms=20.0)
    expected = math.ceil(0.020 * presets.DECODE_IMAGES_PER_S_PER_CORE * 2)
    assert at_20ms.read_parallelism == expected and at_20ms.private_threadpool_size == expected + 2
    fast = presets.tuned_for_store(tuned, "files", presets.NETWORK_FS, two, round_trip_ms=0.1)
    assert fast.read_parallelism == 2  # never fewer than a thread per core
    slow = presets.tuned_for_store(tuned, "files", presets.NETWORK_FS, two, round_trip_ms=500.0)
    assert slow.read_parallelism == presets.NETWORK_FS_MOST_IN_FLIGHT
    records = presets.tuned_for_store(tuned, "records", presets.NETWORK_FS, two)
    assert records.read_parallelism == presets.NETWORK_FS_SHARDS_IN_FLIGHT
    assert records.private_threadpool_size == presets.NETWORK_FS_SHARDS_IN_FLIGHT + 2
    chosen = tuned.replace(read_parallelism=4)  # the user's own choice stays
    assert presets.tuned_for_store(chosen, "files", presets.NETWORK_FS, two, round_trip_ms=20.0) == chosen


def test_a_network_file_system_is_named_at_any_latency_and_read_as_posix():
    at_10, with_bandwidth = sw.parse_scenarios("network-fs:10ms,network-fs:20ms:10Gbit")
    assert (at_10.kind, at_10.latency_ms, at_10.bandwidth_bytes_per_s) == ("network-fs", 10.0, 125e6)
    assert (with_bandwidth.latency_ms, with_bandwidth.bandwidth_bytes_per_s) == (20.0, 10e9 / 8)
    for bad in ("network-fs:", "network-fs:10parsecs", "network-fs:1ms:2ms:3ms"):
        with pytest.raises(ValueError):
            sw.parse_scenarios(bad)
    client = sw.client_named("network-fs")
    assert client.scheme == presets.NETWORK_FS and not client.new_connection_per_request
    pattern = sw.IoPattern("files", 75_000, 1.0)
    assert pattern.requests(client) == 2  # an open and a read, never an object store's one GET
    workload = sw.Workload(cpu_ms_per_image=1.0, cores=2, compute_ms=8.0, batch_size=32, overlapped=True,
                           examples=480)
    what = sw.storage_whatif(pattern, get_preset("seed"), workload, scenarios=(at_10,))
    row = what.scenarios[0].format("files")
    assert row.client == "network-fs" and row.sequential.bound == "requests"
    # one file at a time waits 2 x 10 ms; enough in flight lets the cores decode
    assert row.sequential.images_per_second == pytest.approx(1000 / (20 + 2 * 0.03 + 1.0), rel=0.05)
    assert row.enough_in_flight.images_per_second > 10 * row.sequential.images_per_second
    as_read = sw.as_read_file_system(20.5, 24, "fuse mount", "fuse")
    assert as_read.kind == "network-fs" and as_read.latency_ms == pytest.approx(10.2, abs=0.01)
    assert "fuse mount" in as_read.meaning and sw.as_read_file_system(None, 0, "fuse mount") is None
    # a FUSE mount reads in 128 KiB requests: a 50 MiB shard is 400 of them, not 50
    assert sw.scenario_client(as_read, "tf-gcs").block_bytes == sw.FUSE_BLOCK
    assert sw.as_read_file_system(20.5, 24, "nfs4 mount", "nfs4").block_bytes == 0


def test_shards_read_in_turn_with_a_parallel_decode_gain_only_what_overlaps_the_reads():
    """Seed records on the mount: kept in the chain of reads, 'Decode in parallel' was predicted to gain
    nothing; with the reads and the cores apart, +534% where it measured +10% (benchmarks/advice.py). A
    request brings many records at once and the map takes only as many as its calls while the reader
    waits on the next: the rest are decoded with the reader standing still."""
    # as measured there: the seed's chain 4.53 ms an image, the records read alone 3.54 (0.22 of it CPU)
    workload = sw.Workload(cpu_ms_per_image=1.4, cores=2, compute_ms=8.0, batch_size=32, overlapped=False,
                           examples=480, chain_ms_per_image=4.53, read_chain_ms_per_image=3.54,
                           read_chain_cpu_ms_per_image=0.22)
    pattern = sw.IoPattern("records", 78_000, 1 / 60)
    scenario = sw.parse_scenarios("network-fs:10ms")[0]
    seed = get_preset("seed")
    parallel = seed.replace(map_parallelism=AUTOTUNE)
    client = sw.client_named("network-fs")
    in_turn = sw.as_configured(sw.predict_format(pattern, scenario, client, seed, workload,
                                                 read_chain=workload.read_chain), seed)
    apart = sw.as_configured(sw.predict_format(pattern, scenario, client, parallel, workload,
                                               read_chain=workload.read_chain), parallel)
    assert in_turn.mode == "sequential" and apart.mode == "sequential_reads"
    assert in_turn.images_per_second == pytest.approx(1000.0 / 4.53)
    assert in_turn.images_per_second < apart.images_per_second < 1.25 * in_turn.images_per_second
    # records as large as the reader's buffer, a request each: the map holds the next records while the
    # reader waits, so the reads' chain and the cores work apart
    one_each = dataclasses.replace(pattern, bytes_per_image=300_000, requests_per_image=1.0)
    row = sw.predict_format(one_each, scenario, client, parallel, dataclasses.replace(workload, cpu_ms_per_image=4.0))
    c = row.costs
    chain_rate = 1000.0 / (c.wait_ms + c.transfer_ms + c.client_cpu_ms)
    assert sw.as_configured(row, parallel).images_per_second == pytest.approx(
        min(chain_rate, 2 * 1000.0 / c.cpu_ms))


def test_a_parallel_decode_behind_one_stream_on_a_mount_is_priced_as_it_ran():
    """Seed records on the emulator's 2 ms mount (`diagnose --pipeline seed`, benchmarks/advice.py): the
    chain 2.1 ms an image, the records read alone 0.78 (0.10 of it CPU), 1.76 ms of CPU an image. The
    decode in parallel measured 740 images/s (seed 532): dividing the images behind the reader by the
    map's calls predicted about 960 and a gain of +75% where +39% came; on a network file system the
    images behind the one reader are decoded as if by one thread (measured on a bare decode map too:
    816 images/s in parallel, 822 in the chain)."""
    workload = sw.Workload(cpu_ms_per_image=1.76, cores=2, compute_ms=8.4, batch_size=32, overlapped=False,
                           examples=480, chain_ms_per_image=2.1, read_chain_ms_per_image=0.78,
                           read_chain_cpu_ms_per_image=0.10)
    pattern = sw.IoPattern("records", 78_000, 8 / 480)
    scenario = sw.as_read_file_system(4.2, 480, "fuse mount", "fuse")  # 4.2 ms an open and a read
    seed = get_preset("seed")
    parallel = seed.replace(map_parallelism=AUTOTUNE)
    client = sw.scenario_client(scenario, "tf-gcs")
    in_turn = sw.as_configured(sw.predict_format(pattern, scenario, client, seed, workload,
                                                 read_chain=workload.read_chain), seed)
    row = sw.predict_format(pattern, scenario, client, parallel, workload, read_chain=workload.read_chain)
    apart = sw.as_configured(row, parallel)
    assert in_turn.images_per_second == pytest.approx(1000.0 / 2.1)  # the chain as measured there
    assert apart.images_per_second == pytest.approx(740, rel=0.1)
    # dividing the images behind the reader by the calls, as through an object store's client
    divided, _ = sw.behind_one_reader_rate(dataclasses.replace(row.costs, read_ahead=False), 2, 2)
    assert divided > 1.2 * apart.images_per_second


def test_the_kernels_read_ahead_hides_part_of_a_modelled_chain_on_a_network_file_system():
    """Where the chain was not measured on the storage (a what-if from local disk), a stream of records
    on a network file system waits less than its requests and decode summed: the kernel reads the next
    window while the chain decodes. Files (a whole file per open) and object stores wait the sum."""
    scenario = sw.StorageScenario("x", 2.0, math.inf)
    records = sw.IoPattern("records", 78_000, 1 / 60)
    mount = sw.costs(records, scenario, sw.client_named("network-fs"), cpu_ms_per_image=1.0)
    summed = mount.wait_ms + mount.transfer_ms + mount.client_cpu_ms + mount.own_ms
    hidden = sw.READ_AHEAD_HIDES * min(mount.wait_ms + mount.transfer_ms, mount.own_ms)
    assert hidden > 0 and mount.sequential_ms == pytest.approx(summed - hidden)
    files = sw.costs(sw.IoPattern("files", 78_000, 1.0), scenario, sw.client_named("network-fs"), cpu_ms_per_image=1.0)
    assert files.read_ahead_hidden_ms == 0
    assert sw.costs(records, scenario, sw.tf_gcs_client(environ={}), cpu_ms_per_image=1.0).read_ahead_hidden_ms == 0
    # measured where the data is, the chain has the read-ahead in it already
    measured = sw.costs(records, scenario, sw.client_named("network-fs"), cpu_ms_per_image=1.0,
                        local_chain_ms=1.5, read_chain=(0.8, 0.1))
    assert measured.read_ahead_hidden_ms == 0 and measured.sequential_ms == pytest.approx(1.5)


def test_records_read_alone_where_they_are_replace_the_requests_model():
    """The store as read: the records' reads alone, measured (1.2 ms a record, 0.6 of it CPU, where the
    chain with the decode took 2.3 ms), give the chain its wait and CPU; a parallel decode behind the one
    reader is predicted from them (gs:// at 10 ms: seed 436 images/s, the decode in parallel 546)."""
    workload = sw.Workload(cpu_ms_per_image=2.5, cores=2, compute_ms=8.0, batch_size=32, overlapped=False,
                           examples=480, chain_ms_per_image=2.3, read_chain_ms_per_image=1.2,
                           read_chain_cpu_ms_per_image=0.6)
    pattern = sw.IoPattern("records", 78_000, 1 / 60)
    scenario = sw.parse_scenarios("object-store-region")[0]
    seed = get_preset("seed")
    row = sw.predict_format(pattern, scenario, sw.tf_gcs_client(environ={}), seed, workload,
                            read_chain=workload.read_chain)
    assert row.costs.wait_ms == pytest.approx(0.6) and row.costs.client_cpu_ms == pytest.approx(0.6)
    assert sw.as_configured(row, seed).images_per_second == pytest.approx(1000.0 / 2.3)
    behind = 1.2 + (1 - 2 / 60) * 1.1 / 2
    decode = seed.replace(map_parallelism=AUTOTUNE)
    parallel = sw.as_configured(sw.predict_format(pattern, scenario, sw.tf_gcs_client(environ={}), decode, workload,
                                                  read_chain=workload.read_chain), decode)
    assert parallel.images_per_second == pytest.approx(1000.0 / behind)


def test_advice_that_changes_nothing_is_dropped_and_one_without_gain_is_only_checked():
    """`diagnose` on the mount advised "one intra-op thread per element" to a `tuned` pipeline that
    already had it, and --fix applied it: nothing changed, and the report said the advice did not hold."""
    tuned = get_preset("tuned")
    # 120 ms of one core's work per batch of 32: a sequential decode, or a parallel one on a busy core
    parts = PipelineBreakdown(warm_ms=120.0, cold_ms=None, cpu_ms=120.0, waiting_ms=0.0, storage_ms=0.0,
                              threads=1.0, cpu_ms_per_image=3.75)
    phase = attribute(compute=loop_probe("compute", 10.0, 0.0, 10.0), end_to_end=loop_probe("end_to_end", 121.0, 111.0, 10.0),
                      parts=parts, batch_size=32, cores=2.0, phase="head")
    same = Advice("outer_parallelism", "One intra-op thread per element", {"max_intra_op_parallelism": 1}, "", "", "")
    nothing = Advice("prefetch", "Prefetch at the end", {"prefetch": AUTOTUNE}, "", "", "")
    sequential = tuned.replace(map_parallelism=None, read_parallelism=None)
    parallel = Advice("parallel_map", "Decode in parallel", {"map_parallelism": AUTOTUNE}, "", "", "")
    fixes, checked = differential.price_advice([same, nothing], (phase,), parts, tuned, cores=2.0)
    assert fixes == [] and [a.key for a in checked] == []  # both knobs are set already: nothing to say
    fixes, checked = differential.price_advice([parallel], (phase,), parts, sequential, cores=2.0)
    assert [a.key for a in fixes] == ["parallel_map"] and fixes[0].predicted_gain >= 0.05
    assert "predicted" in fixes[0].gain_basis


def test_the_fix_loop_tries_reads_in_flight_either_side_on_remote_storage_and_shards_in_parallel():
    fixed = get_preset("seed").replace(read_parallelism=11, private_threadpool_size=13)
    tried = fix_loop.next_candidates(fixed, remote=True, cores=2.0)
    assert [(c.read_parallelism, c.private_threadpool_size) for _, c in tried] == [(22, 24), (5, 7)]
    assert fix_loop.next_candidates(fixed, remote=False, cores=2.0) == []
    in_turn = get_preset("seed")  # shards read one at a time: the loop tries them in parallel, anywhere
    assert [c.read_parallelism for _, c in fix_loop.next_candidates(in_turn, remote=False, cores=2.0,
                                                                    kind="records")] == [AUTOTUNE]
    assert fix_loop.next_candidates(in_turn, remote=False, cores=2.0, kind="files") == []
    shared = fix_loop.next_candidates(fixed.replace(read_parallelism=AUTOTUNE), remote=True, cores=2.0, kind="records")
    assert [(c.read_parallelism, c.private_threadpool_size) for _, c in shared] == \
        [(presets.NETWORK_FS_SHARDS_IN_FLIGHT, presets.NETWORK_FS_SHARDS_IN_FLIGHT + 2)]
    assert fix_loop.next_candidates(fixed.replace(read_parallelism=AUTOTUNE), remote=False, cores=2.0) == []
    # records on gs:// read by TF's client: the model saw no gain in the pooled reader, and the fix kept TF's
    # at 380 images/s where by hand the pooled reader gave 641 (benchmarks/advice.py, 10 ms)
    pooled = fix_loop.next_candidates(in_turn.replace(read_parallelism=AUTOTUNE), remote=True, cores=2.0,
                                      kind="records", gs=True)
    assert [(c.gcs_reader, c.read_parallelism, c.private_threadpool_size) for _, c in pooled] == [("pooled", 2, 4)]
    assert fix_loop.next_candidates(pooled[0][1], remote=True, cores=2.0, kind="records", gs=True)[0][1] \
        .gcs_reader == "pooled"  # then the reads in flight either side, through it


@needs_fuse
@pytest.mark.timeout(LIMIT_S)
def test_diagnose_on_a_mount_measures_it_models_posix_and_fixes_with_reads_in_flight(mounted, tmp_path, capsys):
    """The seeds' one-file-at-a-time pipeline on a 10 ms mount: the report names the mount and its
    measured round trip, models opens and reads (not an object store), advises reads in flight on a
    private pool, and --fix saves the best config it measured."""
    fixed = tmp_path / "fixed.json"
    code = main(["diagnose", "--dataset-path", str(mounted), "--pipeline", "seed", "--batch-size", "4",
                 "--image-size", "32", "--accelerator", "emulated:4000", "--probe-steps", "4",
                 "--pipeline-budget", "2", "--fix", "--fixed-config", str(fixed)])
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("storage: "))
    assert line.startswith("storage: fuse mount, ") and line.endswith(" ms per open + read, measured")
    assert float(line.split(", ")[1].split(" ms")[0]) >= 2 * LATENCY_S * 1000
    assert "storage per image (modelled for network-fs): requests 2," in out
    assert "obstore" not in out.split("storage what-if")[0] and "cold page cache not probed" in out
    assert "as read (" in out and "reads in flight on a private thread pool" in out
    assert "advice: none" not in out
    advised = [x for x in out.split("\nadvice (highest predicted gain first)\n")[1].splitlines() if x.startswith("  ") and ". " in x[:6]]
    knob_lines = [x for x in advised if "(--" in x]
    # every knob fix is priced
    assert knob_lines and all("% predicted: " in x for x in knob_lines), advised
    assert any("Keep" in x and "% predicted: " in x for x in knob_lines)
    saved = json.loads(fixed.read_text())
    assert saved["pipeline"]["read_parallelism"] > 1 and saved["pipeline"]["private_threadpool_size"] > 1
    assert saved["diagnosis"]["source"]["storage"]["kind"] == "network-fs"
    assert os.path.ismount(mounted)


def test_the_fix_loop_first_tries_a_prefetch_where_the_fixed_config_has_none():
    """Records on s3:// at 10 ms: the advice (parallel decode, reads in flight) left the seed without a
    prefetch, priced away beside a shuffle that refilled; the loop then tried reads either side and kept
    1,090 images/s where by hand with a prefetch 1,753 (benchmarks/advice.py). A config that has one is
    tried as before."""
    fixed = get_preset("seed").replace(read_parallelism=8, private_threadpool_size=10, map_parallelism=AUTOTUNE)
    assert fixed.prefetch is None
    tried = fix_loop.first_candidates(fixed, remote=True, cores=2.0, kind="records")
    assert tried[0] == ("a prefetch at the end", fixed.replace(prefetch=AUTOTUNE))
    assert tried[1:] == fix_loop.next_candidates(fixed, remote=True, cores=2.0, kind="records")
    prefetched = fixed.replace(prefetch=AUTOTUNE)
    assert fix_loop.first_candidates(prefetched, remote=True, cores=2.0, kind="records") == \
        fix_loop.next_candidates(prefetched, remote=True, cores=2.0, kind="records")


@needs_fuse
@pytest.mark.timeout(LIMIT_S)
def test_your_own_records_on_a_mount_are_measured_as_diagnose_measures_its_own(tiny_tree, tmp_path):
    """`stallscope.diagnose(ds)` on shards on a network file system: as `diagnose` does for its own
    workload, the mount is named with its measured round trip, the records are read alone by one stream
    (the chain a parallel decode sits behind), the daemon serving the mount is found and its CPU counted,
    the storage is modelled as POSIX opens and reads at that round trip, and no cold probe is claimed.
    Before, only shards in a bucket had these: on a mount the report had no storage at all."""
    import tensorflow as tf

    import stallscope
    from stallscope.records.convert import ConvertOptions, convert_tree

    served = tmp_path / "served"
    convert_tree(ConvertOptions(tiny_tree, served / "records", shards=2, workers=1))
    mount = tmp_path / "mnt"
    mount.mkdir()
    with emulate(served, kind="mount", mount_point=mount, latency_s=LATENCY_S, max_duration_s=LIMIT_S):
        shards = sorted(str(p) for p in (mount / "records").rglob("*.tfrecord"))
        assert shards

        def decode(record):
            features = tf.io.parse_single_example(record, {"image/encoded": tf.io.FixedLenFeature([], tf.string)})
            image = tf.image.resize(tf.io.decode_jpeg(features["image/encoded"], channels=3), (32, 32))
            return image, tf.zeros([], tf.int64)

        dataset = tf.data.TFRecordDataset(shards).map(decode).batch(4)
        diagnosis = stallscope.diagnose(dataset, steps=4, files=shards)
    storage = diagnosis.source["storage"]
    assert (storage["kind"], storage["label"], storage["basis"]) == ("network-fs", "fuse mount", "measured")
    assert storage["round_trip_ms"] >= 2 * LATENCY_S * 1000
    assert diagnosis.reads is not None and diagnosis.reads.records > 0
    notes = " ".join(diagnosis.notes)
    assert "cold page cache not probed: the files are on a network file system (fuse mount)" in notes
    assert "the fuse mount is served on this host (FUSE, pid " in notes
    what = diagnosis.storage_whatif
    row = next(r for r in what.scenarios if r.scenario.name == "as read")
    assert row.scenario.kind == "network-fs" and row.scenario.latency_ms >= LATENCY_S * 1000
    assert what.workload.read_chain == pytest.approx((diagnosis.reads.ms_per_image, diagnosis.reads.cpu_ms_per_image))
    assert "storage: fuse mount, " in diagnosis.text()


def test_a_fix_of_the_reads_is_priced_for_the_epochs_that_read_the_store_not_beside_a_cache():
    """On gs:// at 10 ms the reads fix was priced beside the cache advised with it, so its gain counted the
    later epochs as read from memory, while a user applying it alone reads every epoch from the store
    (benchmarks/advice.py: predicted +169%, measured +41% beside the cache)."""
    workload = sw.Workload(cpu_ms_per_image=1.0, cores=2, compute_ms=8.0, batch_size=32, overlapped=True,
                           examples=96)
    seed = get_preset("seed")
    what = sw.storage_whatif(sw.IoPattern("files", 75_000, 1.0), seed, workload,
                             scenarios=(sw.as_read_file_system(20.0, 24, "fuse mount", "fuse"),))
    # one file at a time, 2 x 10 ms each: 672 ms per batch of 32, nearly all of it waiting
    parts = PipelineBreakdown(warm_ms=672.0, cold_ms=None, cpu_ms=32.0, waiting_ms=640.0, storage_ms=640.0,
                              threads=1.0, cpu_ms_per_image=1.0)
    phase = attribute(compute=loop_probe("compute", 8.0, 0.0, 8.0), end_to_end=loop_probe("end_to_end", 680.0, 672.0, 8.0),
                      parts=parts, batch_size=32, cores=2.0, phase="head")
    reads = Advice("reads_in_flight", "Keep reads in flight", {"read_parallelism": 16, "private_threadpool_size": 18},
                   "", "", "")
    cache = Advice("cache", "Cache the first epoch's bytes in memory", {"cache": "memory", "cache_at": "encoded"},
                   "", "", "")
    alone, _ = differential.price_advice([reads], (phase,), parts, seed, cores=2.0, what=what, examples=96)
    beside, _ = differential.price_advice([reads, cache], (phase,), parts, seed, cores=2.0, what=what, examples=96)
    gain = {a.key: a.predicted_gain for a in beside}
    assert alone[0].predicted_gain > 1.0  # many reads in flight hide most of the round trips
    assert gain["reads_in_flight"] == pytest.approx(alone[0].predicted_gain)
    # the cache is priced on its own: the window's first epoch reads the store, the rest come from memory
    assert gain["cache"] > 0.05 and gain["cache"] != pytest.approx(gain["reads_in_flight"])
    assert differential.changes_cache(cache, seed) and not differential.changes_cache(reads, seed)


def test_every_fix_carries_a_predicted_gain_and_what_the_model_cannot_price_is_only_checked():
    """The healthy `fit` programs of benchmarks/advice_programs.py were given "one intra-op thread per
    element" as a fix with "gain not predicted": a user acts on a fix, so only what the model prices
    (at MIN_GAIN or more) is one; the rest is said as checked, not advised."""
    tuned = get_preset("tuned").replace(max_intra_op_parallelism=0)  # TF's default: the advice changes it
    parts = PipelineBreakdown(warm_ms=120.0, cold_ms=None, cpu_ms=120.0, waiting_ms=0.0, storage_ms=0.0,
                              threads=2.0, cpu_ms_per_image=7.5)
    phase = attribute(compute=loop_probe("compute", 10.0, 0.0, 10.0), end_to_end=loop_probe("end_to_end", 121.0, 111.0, 10.0),
                      parts=parts, batch_size=32, cores=2.0, phase="head")
    threads = Advice("outer_parallelism", "One intra-op thread per element", {"max_intra_op_parallelism": 1}, "", "", "")
    convert = Advice("more_shards", "Split the data into more shards", {}, "", "", "")
    fixes, checked = differential.price_advice([threads, convert], (phase,), parts, tuned, cores=2.0)
    assert fixes == [] and [a.key for a in checked] == ["outer_parallelism", "more_shards"]
    assert all(a.predicted_gain is None and a.gain_basis.startswith("not predicted") for a in checked)
    assert "no term for max_intra_op_parallelism" in checked[0].gain_basis
    assert differential.checked_note(checked[0]).startswith("checked, not advised: One intra-op thread")


def test_a_shuffle_refilling_each_epoch_and_the_missing_prefetch_are_one_fix_priced_together():
    """Seed on local files: a prefetch behind a shuffle of decoded images that refills the whole epoch
    hides nothing, and the shuffle moved alone leaves the decode in each step; the two were listed apart,
    the shuffle as a fix "not predicted". Now one fix with both knobs and the model's gain."""
    seed = get_preset("seed").replace(map_parallelism=AUTOTUNE, shuffle_buffer=96, shuffle_and_repeat_fusion=False)
    assert differential.epoch_refill_images(seed, 96) == 96
    parts = PipelineBreakdown(warm_ms=40.0, cold_ms=None, cpu_ms=40.0, waiting_ms=0.0, storage_ms=0.0,
                              threads=2.0, cpu_ms_per_image=2.5)
    phase = attribute(compute=loop_probe("compute", 30.0, 0.0, 30.0), end_to_end=loop_probe("end_to_end", 70.0, 40.0, 30.0),
                      parts=parts, batch_size=32, cores=2.0, phase="head")
    advice = differential.recommend((phase,), seed, parts, examples=96, data_bytes=1_000_000)
    keys = [a.key for a in advice]
    assert "prefetch" not in keys and "shuffle_encoded" in keys
    pair = next(a for a in advice if a.key == "shuffle_encoded")
    assert pair.knobs == {"shuffle_at": "encoded", "prefetch": AUTOTUNE}
    assert "dataset.prefetch(tf.data.AUTOTUNE)" in pair.code
    fixes, _ = differential.price_advice(advice, (phase,), parts, seed, cores=2.0, examples=96)
    priced = next(a for a in fixes if a.key == "shuffle_encoded")
    assert priced.predicted_gain > 0.3  # 70 ms in turn -> 40 ms overlapped
    # with a prefetch there already, the shuffle alone is the fix, and it is priced too
    prefetched = seed.replace(prefetch=AUTOTUNE)
    alone = next(a for a in differential.recommend((phase,), prefetched, parts, examples=96, data_bytes=1_000_000)
                 if a.key == "shuffle_encoded")
    assert alone.knobs == {"shuffle_at": "encoded"}
    fixes, _ = differential.price_advice([alone], (phase,), parts, prefetched, cores=2.0, examples=96)
    assert fixes and fixes[0].predicted_gain > 0.3


def test_a_shuffle_of_all_the_records_before_the_decode_reads_each_epoch_before_decoding_it():
    """Records on the emulator's 10 ms mount, 8 shards read in parallel, decoded in parallel, prefetched:
    1,511 images/s with the seeds' shuffle of decoded images, 1,013 with the shuffle moved before the
    decode (benchmarks/advice.py's cell). TF's reader ends each epoch, the buffer holds all of it, and
    without TF's shuffle-and-repeat fusion it empties at each epoch end: the epoch's reads come first,
    with no decode beside them, and no prefetch hides them."""
    workload = sw.Workload(cpu_ms_per_image=1.0, cores=2, compute_ms=8.0, batch_size=32, overlapped=False,
                           examples=480)
    pattern = sw.IoPattern("records", 50_000, 8 / 480)
    scenario = sw.parse_scenarios("network-fs:10ms")[0]
    client = sw.client_named("network-fs")
    decoded = get_preset("seed").replace(read_parallelism=8, private_threadpool_size=10, map_parallelism=AUTOTUNE,
                                         prefetch=AUTOTUNE, deterministic=False)
    encoded = decoded.replace(shuffle_at="encoded")
    assert sw.refills_from_storage(encoded, "records", 480, client)
    assert not sw.refills_from_storage(decoded, "records", 480, client)
    row = sw.predict_format(pattern, scenario, client, encoded, workload)
    before = sw.as_configured(row, encoded)
    after = sw.as_configured(sw.predict_format(pattern, scenario, client, decoded, workload), decoded)
    assert before.images_per_second < 0.9 * after.images_per_second
    fill, decode = sw.fill_ms(row.costs, 8, 2), (row.costs.cpu_ms - row.costs.client_cpu_ms) / 2
    assert fill > 0 and decode > 0 and before.images_per_second == pytest.approx(1000.0 / (fill + decode))
    assert before.prediction.unhidden_ms == pytest.approx(32 * fill)
    assert before.prediction.step_ms == pytest.approx(32 * fill + max(8.0, 32 * decode))
    # nothing to take in again: TF's fusion keeps the buffer, stallscope's reader shuffles a window of a
    # repeated stream, a smaller buffer is a window too, and files shuffle their names
    assert not sw.refills_from_storage(encoded.replace(shuffle_and_repeat_fusion=None), "records", 480, client)
    assert not sw.refills_from_storage(encoded, "records", 480, sw.client_named("obstore"))
    assert not sw.refills_from_storage(encoded.replace(shuffle_buffer=100), "records", 480, client)
    assert not sw.refills_from_storage(encoded, "files", 480, client)


def test_the_fix_leaves_out_an_advice_that_gains_alone_but_not_beside_the_rest():
    """The seed's records on a 10 ms mount: reads in flight and the shuffle moved before the decode were
    each priced alone and `--fix` applied both; together the shuffle puts each epoch's reads before its
    decode (1,013 images/s against 1,511 by hand without it). The fix applies what the model says gains
    beside the rest, and says what it left out."""
    seed = get_preset("seed")
    workload = sw.Workload(cpu_ms_per_image=1.0, cores=2, compute_ms=8.0, batch_size=32, overlapped=False,
                           examples=480)
    what = sw.storage_whatif(sw.IoPattern("records", 50_000, 8 / 480), seed, workload,
                             scenarios=(sw.as_read_file_system(20.0, 24, "fuse mount", "fuse"),))
    parts = PipelineBreakdown(warm_ms=160.0, cold_ms=None, cpu_ms=32.0, waiting_ms=128.0, storage_ms=128.0,
                              threads=1.0, cpu_ms_per_image=1.0)
    phase = attribute(compute=loop_probe("compute", 12.0, 0.0, 12.0),
                      end_to_end=loop_probe("end_to_end", 172.0, 160.0, 12.0), parts=parts, batch_size=32, cores=2.0,
                      phase="head")
    reads = Advice("reads_in_flight", "Keep reads in flight",
                   {"read_parallelism": 8, "private_threadpool_size": 10, "map_parallelism": AUTOTUNE,
                    "deterministic": False, "prefetch": AUTOTUNE}, "", "", "")
    shuffle = Advice("shuffle_encoded", "Shuffle before decoding, prefetch at the end",
                     {"shuffle_at": "encoded", "prefetch": AUTOTUNE}, "", "", "")
    fixes, _ = differential.price_advice([reads, shuffle], (phase,), parts, seed, cores=2.0, what=what, examples=480)
    assert [a.key for a in fixes] == ["reads_in_flight", "shuffle_encoded"]  # each gains alone
    kept, left = fix_loop.combined_advice((phase,), parts, seed, (reads, shuffle), cores=2.0, what=what, examples=480)
    assert kept == (reads,) and [item.advice for item in left] == [shuffle]
    assert left[0].without > left[0].with_it
    assert left[0].to_dict()["advice"] == "shuffle_encoded"
    # where they do add up (no storage: the shuffle's refill is of file names), both are kept
    local, nothing_left = fix_loop.combined_advice((phase,), parts, seed, (reads, shuffle), cores=2.0, what=None,
                                                   examples=480)
    assert local == (reads, shuffle) and nothing_left == ()


def test_a_fuse_daemons_cpu_on_these_cores_is_work_not_waiting():
    """Records on the emulator's 10 ms mount: reads in flight were predicted +656% and measured +263%
    (benchmarks/advice.py): the mount's daemon answers every request on the same two cores. Its CPU per
    image, measured, stays in each request's time and is the cores' work too, which caps what more reads
    in flight can gain."""
    scenario = sw.as_read_file_system(20.0, 24, "fuse mount", "fuse")
    client = sw.scenario_client(scenario, "tf-gcs")
    records = sw.IoPattern("records", 75_000, 1.0 / 96)
    remote = sw.costs(records, scenario, client, cpu_ms_per_image=1.0, read_chain=(4.0, 0.5))
    local = sw.costs(records, scenario, client, cpu_ms_per_image=1.0, read_chain=(4.0, 0.5),
                     server_cpu_ms_per_image=1.5)
    assert local.wait_ms == pytest.approx(remote.wait_ms) and local.cpu_ms == pytest.approx(remote.cpu_ms + 1.5)
    files = sw.IoPattern("files", 75_000, 1.0)
    workload = sw.Workload(cpu_ms_per_image=2.0, cores=2, compute_ms=8.0, batch_size=32, overlapped=True,
                           examples=96)
    rates = []
    for server in (0.0, 1.5):
        what = sw.storage_whatif(files, get_preset("seed"), dataclasses.replace(workload, server_cpu_ms_per_image=server),
                                 as_read=scenario)
        rates.append(sw.as_read_row(what).format("files").enough_in_flight.images_per_second)
    assert rates[1] < 0.7 * rates[0]  # 2 cores over 2 ms of decode, then over 3.5 ms with the daemon's


@needs_fuse
@pytest.mark.timeout(LIMIT_S)
def test_diagnose_counts_the_cpu_of_a_fuse_daemon_on_this_host(tiny_tree, tmp_path, capsys):
    """A mount served by another process on this host (as gcsfuse or mountpoint-s3 would be): diagnose
    finds its daemon by the /dev/fuse it holds, measures its CPU per image over the warm probe and gives it
    to the model of the storage as read."""
    import subprocess
    import sys
    import time

    mount = tmp_path / "mnt"
    mount.mkdir()
    ready = tmp_path / "ready"
    server = subprocess.Popen([sys.executable, "-m", "stallscope", "storage", "serve", str(tiny_tree), "--mount",
                               str(mount), "--latency", "2ms", "--for", f"{LIMIT_S}s", "--ready-file", str(ready)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), server.stderr.read().decode() if server.poll() is not None else "not ready in 60 s"
        code = main(["diagnose", "--dataset-path", str(mount), "--pipeline", "seed", "--batch-size", "4",
                     "--image-size", "32", "--accelerator", "emulated:4000", "--probe-steps", "4",
                     "--pipeline-budget", "2", "--json"])
        out = capsys.readouterr().out
        assert code == 0, out
        report = json.loads(out)
        note = next(n for n in report["notes"] if "is served on this host (FUSE" in n)
        assert f"pid {server.pid}" in note
        workload = report["storage_what_if"]["workload"]
        assert workload["server_cpu_ms_per_image"] > 0
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert not os.path.ismount(mount)
