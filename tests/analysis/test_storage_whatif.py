"""The storage what-if's arithmetic against hand-computed cases, the counters file, and the advice."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from stallscope.analysis import storage_whatif as sw
from stallscope.analysis.advice import apply_advice, merge_advice, storage_advice
from stallscope.analysis.storage_counters import (
    StorageCounters,
    load_storage_counters,
    measured_pattern,
    reader_pattern,
    storage_figures,
)
from stallscope.config import AUTOTUNE
from stallscope.errors import UsageError
from stallscope.pipeline.config import PipelineConfig
from stallscope.pipeline.presets import PRESETS
from stallscope.storage.request_tally import RequestTally

# A client whose figures make the arithmetic easy to follow: s = 2 ms (0.5 of it CPU), no transfer CPU.
PLAIN = sw.StorageClient(name="plain", block_bytes=sw.MIB, requests_per_open=0, request_overhead_ms=2.0,
                         request_cpu_ms=0.5, transfer_cpu_ms_per_mib=0.0, new_connection_per_request=True, handshake_round_trips=0,
                         description="test")
JPEG = sw.IoPattern("files", 100_000, 1.0)


def test_requests_per_object_follow_the_block_size():
    assert sw.tf_gcs_client(64).requests_per_object(76_000) == 1
    assert sw.tf_gcs_client(1).requests_per_object(50 * sw.MIB) == 50
    assert sw.tf_gcs_client(1).requests_per_object(50 * sw.MIB + 1) == 51
    assert sw.s3fs_client().requests_per_object(12 * sw.MIB) == 3
    assert sw.posix_client().requests_per_object(76_000) == 2  # open + one read


def test_tf_gcs_block_comes_from_its_environment_variable():
    assert sw.tf_gcs_client(environ={}).block_bytes == 64 * sw.MIB
    one = sw.tf_gcs_client(environ={"GCS_READ_CACHE_BLOCK_SIZE_MB": "1"})
    assert one.block_bytes == sw.MIB
    # a whole-object read's buffer costs what it receives, not its block; a streamed read's, its block
    assert sw.tf_gcs_client(64).request_cpu_ms == one.request_cpu_ms
    assert sw.tf_gcs_client(64).transfer_cpu_ms_per_mib == one.transfer_cpu_ms_per_mib
    with pytest.raises(UsageError, match="GCS_READ_CACHE_BLOCK_SIZE_MB"):
        sw.tf_gcs_client(environ={"GCS_READ_CACHE_BLOCK_SIZE_MB": "big"})


def test_sequential_rate_is_one_over_requests_bandwidth_and_cpu():
    # r = 1, L = 10, s = 2, b / B = 100 kB / 10 MB/s = 10 ms, d = 3 (+ 0.5 request CPU)
    c = sw.costs(JPEG, sw.StorageScenario("x", 10.0, 1e7), PLAIN, cpu_ms_per_image=3.0)
    assert (c.requests, c.wait_ms, c.transfer_ms, c.cpu_ms, c.client_cpu_ms) == (1, 11.5, 10.0, 3.5, 0.5)
    assert sw.sequential_rate(c) == pytest.approx(1000 / (1 * (10 + 2) + 10 + 3))  # 40 images/s
    assert sw.sequential_bound(c) == "requests"
    unlimited = sw.costs(JPEG, sw.StorageScenario("x", 10.0, math.inf), PLAIN, cpu_ms_per_image=3.0)
    assert sw.sequential_rate(unlimited) == pytest.approx(1000 / 15)


def test_measured_overhead_replaces_the_clients_default():
    c = sw.costs(JPEG, sw.StorageScenario("x", 0.0, math.inf), PLAIN, cpu_ms_per_image=3.0, request_overhead_ms=5.0)
    assert c.wait_ms == 4.5 and sw.sequential_rate(c) == pytest.approx(1000 / 8)


def test_shared_pool_keeps_few_requests_in_flight_and_a_private_pool_many():
    c = sw.costs(JPEG, sw.StorageScenario("x", 10.0, math.inf), PLAIN, cpu_ms_per_image=3.0)
    shared = sw.Reads(parallel_calls=16, pool_threads=2, reads_in_decode_map=True, private_pool=False)
    # two threads, each waiting 11.5 of every 15 ms: 1.53 requests in flight, not 16
    assert sw.requests_in_flight(shared, c) == pytest.approx(2 * 11.5 / 15)
    rate, bound = sw.parallel_rate(c, sw.requests_in_flight(shared, c), cores=2)
    assert rate == pytest.approx(2000 / 15) and bound == "requests"
    private = sw.Reads(parallel_calls=16, pool_threads=32, reads_in_decode_map=False, private_pool=True)
    assert sw.requests_in_flight(private, c) == 16
    rate, bound = sw.parallel_rate(c, 16, cores=2)
    assert rate == pytest.approx(2000 / 3.5) and bound == "cpu"  # the cores cap it: 571 images/s
    # Little's law: 571 images/s x 11.5 ms = 6.6 requests held -> 7
    assert sw.needed_in_flight(c, cores=2) == 7
    assert sw.requests_in_flight(sw.Reads(None, 2, True, False), c) == 1.0


def test_one_thread_that_mostly_decodes_holds_a_request_less_than_all_the_time():
    """A parallel read on a one-thread pool is as slow as reading one at a time: the thread waits, then
    decodes (T / (w + d)), not the better of the two (C held at one gave min(1 / w, 1 / d))."""
    c = sw.costs(JPEG, sw.StorageScenario("x", 0.0, math.inf), PLAIN, cpu_ms_per_image=3.0, request_overhead_ms=1.5)
    one = sw.Reads(parallel_calls=16, pool_threads=1, reads_in_decode_map=True, private_pool=False)
    assert sw.requests_in_flight(one, c) == pytest.approx(1.0 / 4.5)  # waits 1 of every 4.5 ms
    rate, bound = sw.parallel_rate(c, sw.requests_in_flight(one, c), cores=1)
    assert rate == pytest.approx(1000 / 4.5) and bound == "requests"


def test_bandwidth_caps_the_parallel_rate():
    c = sw.costs(JPEG, sw.StorageScenario("x", 10.0, 1e6), PLAIN, cpu_ms_per_image=3.0)
    rate, bound = sw.parallel_rate(c, 16, cores=2)
    assert rate == pytest.approx(10.0) and bound == "bandwidth"  # 1 MB/s / 100 kB


def test_client_cpu_is_named_as_the_limit_when_it_outweighs_decoding():
    big = sw.IoPattern("files", 2 * sw.MIB, 1.0)  # ~2.2 ms of the client's CPU per image
    c = sw.costs(big, sw.StorageScenario("x", 0.0, math.inf), sw.tf_gcs_client(64), cpu_ms_per_image=1.6)
    assert sw.parallel_rate(c, 1, cores=2)[1] == "client"
    assert sw.sequential_bound(c) == "client"


def test_the_model_reproduces_sequential_reads_through_tfs_gcs_on_the_emulator():
    """`stallscope train --pipeline seed` (one read at a time) on 20 KB JPEGs through TF's gs:// on
    the storage emulator (benchmarks/storage.py): a new TLS connection per GET makes each image wait
    3 latencies. The CPU per image is set from the 0 ms run, as a diagnosis at 0 ms measures it."""
    measured = {0: 232, 3: 60, 10: 27, 30: 10}
    jpeg = sw.IoPattern("files", 20_300, 1.0)
    at_zero = sw.costs(jpeg, sw.StorageScenario("x", 0, math.inf), sw.tf_gcs_client(), cpu_ms_per_image=0.0)
    cpu = 1000 / measured[0] - at_zero.sequential_ms
    for latency, images_per_second in measured.items():
        c = sw.costs(jpeg, sw.StorageScenario("x", latency, math.inf), sw.tf_gcs_client(), cpu_ms_per_image=cpu)
        assert sw.sequential_rate(c) == pytest.approx(images_per_second, rel=0.3), latency


def test_the_measured_local_pace_bounds_the_pipelines_own_part_of_a_sequential_chain():
    """A pipeline's CPU per image counts TF's threads beside the chain; where the diagnosis measured the
    local pace, the chain's own part is no more than it. The CPU cap of parallel reads keeps the CPU."""
    scenario = sw.StorageScenario("x", 10.0, math.inf)
    by_cpu = sw.costs(JPEG, scenario, PLAIN, cpu_ms_per_image=0.9)
    by_pace = sw.costs(JPEG, scenario, PLAIN, cpu_ms_per_image=0.9, local_chain_ms=0.3)
    slower_pace = sw.costs(JPEG, scenario, PLAIN, cpu_ms_per_image=0.9, local_chain_ms=2.0)
    assert by_cpu.sequential_ms - by_pace.sequential_ms == pytest.approx(0.6)
    assert slower_pace.sequential_ms == pytest.approx(by_cpu.sequential_ms)  # never more than its CPU
    assert sw.parallel_rate(by_pace, 16, cores=2) == sw.parallel_rate(by_cpu, 16, cores=2)


def test_parallel_reads_need_no_more_cpu_per_image_than_the_cores_sustained_locally():
    """Process CPU counts TF's spinning threads: a pipeline that ran at 0.3 ms per image on 2 cores
    needs at most 0.6 ms of core time per image; a slower chain (one read at a time) keeps its CPU."""
    base = dict(cores=2.0, compute_ms=1.0, batch_size=16, overlapped=True, examples=160)
    assert sw.sustained_cpu_ms(sw.Workload(cpu_ms_per_image=1.6, chain_ms_per_image=0.3, **base)) == pytest.approx(0.6)
    assert sw.sustained_cpu_ms(sw.Workload(cpu_ms_per_image=1.6, chain_ms_per_image=2.0, **base)) == 1.6
    assert sw.sustained_cpu_ms(sw.Workload(cpu_ms_per_image=1.6, **base)) == 1.6


def test_a_store_on_this_host_spends_its_request_time_on_these_cores():
    """s beyond the client's CPU is the store's own time; an emulator on the same cores spends it as CPU,
    so its measured CPU per request moves that much from the wait into the cores' budget."""
    scenario = sw.StorageScenario("x", 10.0, math.inf)
    gcs = sw.tf_gcs_client()
    remote = sw.costs(JPEG, scenario, gcs, cpu_ms_per_image=1.0)
    store_time = gcs.request_overhead_ms - gcs.request_cpu_ms
    here = sw.costs(JPEG, scenario, gcs, cpu_ms_per_image=1.0, server_cpu_ms_per_request=0.8 * store_time)
    busier = sw.costs(JPEG, scenario, gcs, cpu_ms_per_image=1.0, server_cpu_ms_per_request=3.0)
    assert remote.wait_ms - here.wait_ms == pytest.approx(0.8 * store_time)
    assert here.cpu_ms - remote.cpu_ms == pytest.approx(0.8 * store_time)
    assert here.sequential_ms == pytest.approx(remote.sequential_ms)  # one chain: the same time, spent here
    assert busier.sequential_ms == pytest.approx(remote.sequential_ms + 3.0 - store_time)
    at_zero = sw.StorageScenario("x", 0.0, math.inf)
    remote, here = (sw.costs(JPEG, at_zero, gcs, cpu_ms_per_image=1.0, server_cpu_ms_per_request=cpu) for cpu in (0.0, 1.0))
    assert sw.parallel_rate(here, 16, cores=2)[0] == pytest.approx(2000 / here.cpu_ms)  # the cores cap it
    assert sw.parallel_rate(here, 16, cores=2)[0] < sw.parallel_rate(remote, 16, cores=2)[0]


def test_the_s3_reader_is_modelled_as_it_runs():
    """stallscope's s3:// reader fetches JPEGs in groups of up to 16 requests, two groups at least, each
    group holding a tf.data thread while it waits (the decode needs the same threads), and opens a shard
    without a HEAD (its size is the run's listing's)."""
    from stallscope.storage import tfdata_readers, s3_request_plan

    assert tfdata_readers.in_flight is s3_request_plan.in_flight and tfdata_readers.SHARD_BLOCK_BYTES == s3_request_plan.SHARD_BLOCK_BYTES
    s3 = sw.s3fs_client()
    shards = sw.IoPattern("records", 20_000, 1 / 32)  # 640 KB shards: one GET each
    assert shards.requests(s3) == pytest.approx(1 / 32)
    assert sw.IoPattern("files", 20_000, 1.0).requests(s3) == 1.0
    scenario = sw.StorageScenario("x", 30.0, math.inf)
    assert sw.costs(shards, scenario, s3, cpu_ms_per_image=0.5).wait_ms == pytest.approx(30 / 32)
    workload = sw.Workload(cpu_ms_per_image=0.5, cores=2, compute_ms=1.0, batch_size=16, overlapped=True,
                           examples=128, machine_cores=2)
    tuned = PipelineConfig(batch_size=16, read_parallelism=AUTOTUNE, map_parallelism=AUTOTUNE)
    row = sw.predict_format(sw.IoPattern("files", 20_000, 1.0), scenario, s3, tuned, workload)
    # Two groups of 16 could hold 32 requests, but on tf.data's 2 shared threads a thread waits 30 ms for
    # its group, then decodes its 16 images (0.5 ms each): 2 x 16 x 30 / (30 + 8) requests in flight.
    assert row.parallel.in_flight == pytest.approx(2 * 16 * 30 / (30 + 16 * 0.5))
    assert "groups of 16 that each hold a thread of tf.data's shared pool" in row.parallel.reads
    private = dataclasses.replace(tuned, private_threadpool_size=10)
    row = sw.predict_format(sw.IoPattern("files", 20_000, 1.0), scenario, s3, private, workload)
    assert row.parallel.in_flight == 32  # threads to spare: both groups wait at once
    fewer = dataclasses.replace(private, read_parallelism=5)  # 2 groups of 5
    assert sw.predict_format(sw.IoPattern("files", 20_000, 1.0), scenario, s3, fewer, workload).parallel.in_flight == 10


def test_the_what_if_models_the_s3_reader_that_runs(monkeypatch):
    """obstore reads whole objects at under a tenth of s3fs's CPU per request and receives bytes at 0.4x its
    CPU per MiB; shards are streamed in the same blocks by both."""
    from stallscope.storage import s3_request_plan

    for reader in ("s3fs", "obstore"):
        monkeypatch.setenv(s3_request_plan.READER_ENV, reader)
        assert sw.client_for_path("s3://bucket/tree") == reader and sw.client_for_path("gs://bucket/tree") == "tf-gcs"
    obstore, s3fs = sw.obstore_client(), sw.s3fs_client()
    assert obstore.request_cpu_ms * 10 < s3fs.request_cpu_ms
    # 4 MiB, then 16 MiB blocks (`tfdata_readers.block_spans`)
    assert obstore.requests_per_streamed_object(64 * sw.MIB) == s3fs.requests_per_streamed_object(64 * sw.MIB) == 5
    assert s3fs.requests_per_streamed_object(20 * sw.MIB) == 2 and s3fs.requests_per_streamed_object(4 * sw.MIB) == 1
    scenario = sw.StorageScenario("x", 0.0, math.inf)
    jpeg = sw.IoPattern("files", 75_000, 1.0)
    cheap, dear = (sw.costs(jpeg, scenario, c, cpu_ms_per_image=1.0) for c in (obstore, s3fs))
    # the CPU per GET and per MiB received that decoding competes with
    assert dear.cpu_ms - cheap.cpu_ms == pytest.approx(s3fs.request_cpu_ms - obstore.request_cpu_ms + 1.5 * 75_000 / sw.MIB)


def test_a_new_connection_per_request_waits_its_handshake_too():
    pooled = dataclasses.replace(PLAIN, new_connection_per_request=False, handshake_round_trips=2)
    fresh = dataclasses.replace(PLAIN, handshake_round_trips=2)
    scenario = sw.StorageScenario("x", 10.0, math.inf)
    assert sw.costs(JPEG, scenario, pooled, cpu_ms_per_image=1.0).wait_ms == pytest.approx(10 + 1.5)
    assert sw.costs(JPEG, scenario, fresh, cpu_ms_per_image=1.0).wait_ms == pytest.approx(3 * 10 + 1.5)


def test_converting_files_to_records_shards_them_as_convert_does():
    records = sw.converted(JPEG, examples=1000)
    assert records.format == "records" and records.bytes_per_image == 100_016
    assert records.objects_per_image == pytest.approx(1 / 525)  # ceil(50 MiB / 100,016 B) images per shard
    assert sw.converted(JPEG, examples=10).objects_per_image == pytest.approx(1 / 10)  # one shard holds all
    back = sw.converted(records, examples=1000)
    assert back.format == "files" and back.objects_per_image == 1.0 and back.bytes_per_image == 100_000
    assert sw.pattern_for("records", examples=1000, total_bytes=10**8, files=4).objects_per_image == 0.004


@pytest.mark.parametrize("text, expected", [
    ("10ms,200Mbit", [(10.0, 25e6)]),
    ("10ms,200Mbit,30ms,1Gbit", [(10.0, 25e6), (30.0, 125e6)]),
    ("500us,100MB/s", [(0.5, 1e8)]),
    ("0ms,unlimited", [(0.0, math.inf)]),
    ("network-fs,1s,10MiB/s", [(2.0, 125e6), (1000.0, 10 * sw.MIB)]),
])
def test_scenarios_parse(text, expected):
    assert [(s.latency_ms, s.bandwidth_bytes_per_s) for s in sw.parse_scenarios(text)] == expected


@pytest.mark.parametrize("text, message", [
    ("10parsecs", "LATENCY,BANDWIDTH"),
    ("10ms", "a bandwidth after the latency"),
    ("10ms,0Mbit", "a bandwidth above 0"),
    ("10ms,200furlongs", "a bandwidth above 0"),
    ("", "LATENCY,BANDWIDTH"),
])
def test_bad_scenarios_say_what_was_expected(text, message):
    with pytest.raises(ValueError, match=message):
        sw.parse_scenarios(text)


SEED = PRESETS["seed"].replace(batch_size=10)
WORKLOAD = sw.Workload(cpu_ms_per_image=3.0, cores=2.0, compute_ms=10.0, batch_size=10, overlapped=False,
                       examples=1000)


def test_a_cell_carries_the_step_the_device_sees():
    row = sw.predict_format(JPEG, sw.StorageScenario("x", 10.0, 1e7), PLAIN, SEED, WORKLOAD)
    # sequential 40 images/s: 250 ms per batch of 10; serial with a 10 ms step: 260 ms, 96% waiting
    assert row.sequential.images_per_second == pytest.approx(40)
    assert row.sequential.prediction.step_ms == pytest.approx(260)
    assert row.sequential.prediction.input_share == pytest.approx(250 / 260)
    # seed reads one at a time: the parallel column is autotune on the shared pool (2 threads)
    assert row.parallel.read_parallelism == AUTOTUNE and row.parallel.private_threadpool_size == 0
    assert row.enough_in_flight.private_threadpool_size == row.enough_in_flight.read_parallelism + 2
    assert row.basis == "modelled" and row.connections_per_image == 1.0
    assert sw.as_configured(row, SEED) is row.sequential
    assert sw.as_configured(row, SEED.replace(map_parallelism=4)) is row.parallel


def test_records_reads_in_flight_stop_at_the_shard_count():
    few_shards = sw.IoPattern("records", 100_000, 4 / 1000)
    row = sw.predict_format(few_shards, sw.StorageScenario("x", 100.0, math.inf), sw.tf_gcs_client(1),
                            SEED.replace(read_parallelism=16), WORKLOAD)
    assert row.parallel.in_flight <= 4 and row.enough_in_flight.read_parallelism <= 4


def test_whatif_shows_presets_unless_stores_are_named():
    what = sw.storage_whatif(JPEG, SEED, WORKLOAD)
    assert [r.scenario.name for r in what.scenarios] == list(sw.PRESETS) and not any(r.named for r in what.scenarios)
    assert {f.format for r in what.scenarios for f in r.formats} == {"files", "records"}
    local = what.scenarios[0]
    assert {f.client for f in local.formats} == {"posix"}  # a file system preset reads through the file system
    named = sw.storage_whatif(JPEG, SEED, WORKLOAD, scenarios=sw.parse_scenarios("10ms,200Mbit"), object_client="s3fs")
    assert len(named.scenarios) == 1 and named.scenarios[0].named
    assert {f.client for f in named.scenarios[0].formats} == {"s3fs"}
    assert json.dumps(named.to_dict(), default=str)


def _counters(path, **values):
    path.write_text(json.dumps(values))
    return path


def test_counters_file_loads_and_its_difference_is_per_probe(tmp_path):
    path = _counters(tmp_path / "c.json", requests=120, connections=8, bytes=9_000_000, latency_ms=10)
    before = StorageCounters(requests=20, connections=4, bytes=1_000_000)
    delta = load_storage_counters(path) - before
    assert delta == StorageCounters(100, 4, 8_000_000)
    pattern = measured_pattern(JPEG, delta, images=100)
    assert pattern.measured and pattern.requests(PLAIN) == 1.0 and pattern.connections(PLAIN) == 0.04
    assert pattern.bytes_per_image == 80_000
    figures = storage_figures(pattern, PLAIN, wait_ms_per_image=2.0, read_calls=2.12, files_opened=1.0)
    assert figures.basis == "measured" and figures.requests == 1.0
    modelled = storage_figures(JPEG, sw.s3fs_client(), wait_ms_per_image=0.0)
    assert modelled.basis == "modelled" and modelled.requests == 1 and modelled.connections == 0.0
    assert measured_pattern(JPEG, StorageCounters(0, 0, 0), images=100) is JPEG  # nothing served: modelled
    with pytest.raises(UsageError, match="went down"):
        before - load_storage_counters(path)


def _read(times_ms, size=75_000, ahead=0):
    """A tally of requests of `size` bytes taking `times_ms`, and `ahead` more bytes of blocks asked
    for ahead when the probe stopped."""
    samples = tuple((ms / 1000, size) for ms in times_ms)
    return RequestTally(len(samples), len(samples) * size + ahead, sum(t for t, _ in samples), samples)


def test_requests_counted_by_stallscopes_reader_are_taken_per_byte_received():
    reads = _read([10.0 + i / 10 for i in range(100)], ahead=50 * 75_000)  # 50 images' blocks read ahead
    pattern = reader_pattern(JPEG, reads, images=80)
    # 100 requests over 150 images' bytes: 0.67 per 100 KB image, whatever the probe had taken
    assert pattern.measured and pattern.requests(PLAIN) == pytest.approx(100 * 100_000 / (150 * 75_000))
    assert pattern.bytes_per_image == JPEG.bytes_per_image and pattern.connections_per_image is None
    figures = storage_figures(JPEG, sw.obstore_client(), wait_ms_per_image=0.5, requests=reads, images=80)
    assert figures.basis == "reader" and figures.connections == 0.0  # kept alive: modelled
    # Reported per image trained (what was fetched, read-ahead included, over the 80 images taken); the
    # what-if's steady rate per image read beside it
    assert figures.requests == pytest.approx(100 / 80) and figures.bytes == pytest.approx(150 * 75_000 / 80)
    assert figures.steady_requests == pytest.approx(100 * 100_000 / (150 * 75_000))
    assert figures.request_ms_median == pytest.approx(14.95) and figures.request_ms_p90 == pytest.approx(18.91, abs=0.01)
    by_store = measured_pattern(JPEG, StorageCounters(100, 4, 10_000_000), images=100)
    assert storage_figures(by_store, PLAIN, wait_ms_per_image=0.0, requests=reads, images=80).basis == "measured"
    assert reader_pattern(by_store, reads, images=80) is by_store  # the store's own counts come first
    assert reader_pattern(JPEG, RequestTally(), images=80) is JPEG
    assert storage_figures(JPEG, PLAIN, wait_ms_per_image=0.0, requests=RequestTally(), images=80).basis == "modelled"
    heads = RequestTally(40, 0, 0.4, tuple((0.01, 0) for _ in range(40)))
    assert reader_pattern(JPEG, heads, images=20).requests(PLAIN) == 2.0


def test_the_store_as_read_takes_its_latency_from_the_fastest_small_requests():
    client = sw.obstore_client()
    # most requests met a slower moment (20-28 ms); the fastest tenth took 11 ms
    reads = _read([11.0] * 15 + [20.0 + i / 10 for i in range(85)], size=1)
    scenario = sw.as_read_scenario(reads, client)
    assert scenario.name == "as read" and scenario.kind == "object" and math.isinf(scenario.bandwidth_bytes_per_s)
    assert scenario.latency_ms == pytest.approx(round(11.0 - client.request_overhead_ms, 1))
    assert "100 small GETs, one at a time, took 11.0 ms" in scenario.meaning
    assert "bandwidth not measured" in scenario.meaning
    shards = sw.as_read_scenario(reads, client, bandwidth_bytes_per_s=24_831_000.0)  # measured on shards' blocks
    assert shards.bandwidth_bytes_per_s == 24_800_000.0 and "moved 199 Mbit/s" in shards.meaning
    assert shards.label == f"as read ({scenario.latency_ms:g}ms,198.4Mbit)"
    assert sw.as_read_scenario(_read([11.0] * 19), client) is None  # too few to tell
    assert sw.as_read_scenario(_read([40.0] * 50, size=16 << 20), client) is None  # a shard's blocks: transfer
    assert sw.as_read_scenario(None, client) is None
    what = sw.storage_whatif(JPEG, SEED, WORKLOAD, object_client="obstore", as_read=scenario)
    assert [r.scenario.name for r in what.scenarios] == ["as read", *sw.PRESETS]
    assert [r.named for r in what.scenarios] == [True] + [False] * len(sw.PRESETS)  # advice looks at it
    advice = storage_advice(what, SEED, data_bytes=10**8, memory_bytes=10**10, local_images_per_second=600)
    assert advice and "at as read (10.8ms,unlimited)" in advice[0].evidence
    named = sw.storage_whatif(JPEG, SEED, WORKLOAD, scenarios=sw.parse_scenarios("30ms,1Gbit"), as_read=scenario)
    assert [(r.scenario.name, r.named) for r in named.scenarios] == [("as read", True), ("30ms,1Gbit", True)]


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{", "not valid JSON"),
    ("[1]", "expected a JSON object"),
    ('{"requests": 1, "bytes": 2}', "missing connections"),
    ('{"requests": -1, "connections": 0, "bytes": 2}', "requests: expected an integer >= 0"),
    ('{"requests": 1.5, "connections": 0, "bytes": 2}', "requests: expected an integer >= 0"),
])
def test_bad_counters_file_is_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / "counters.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=message) as info:
        load_storage_counters(path)
    assert "--storage-counters" in str(info.value) and "\n" not in str(info.value)


def _named(text, config, client="tf-gcs", pattern=JPEG):
    return sw.storage_whatif(pattern, config, WORKLOAD, scenarios=sw.parse_scenarios(text), object_client=client)


def test_storage_advice_when_requests_dominate(monkeypatch):
    """TF's gs:// client alone (obstore not installed): enough reads in flight for its requests."""
    from stallscope.storage import gcs_obstore

    monkeypatch.setattr(gcs_obstore, "available", lambda: False)
    monkeypatch.setenv(sw.GCS_BLOCK_ENV, "1")
    advice = storage_advice(_named("30ms,1Gbit", SEED), SEED, data_bytes=10**8, memory_bytes=10**10,
                            local_images_per_second=600)
    keys = [a.key for a in advice]
    assert keys == ["convert_records", "reads_in_flight", "cache", "connection_reuse"]
    reads = advice[1]
    # 571 images/s (2 cores / 3.5 ms... with TF's 1 MB block: its own figures) x the wait per request
    assert reads.knobs["private_threadpool_size"] == reads.knobs["read_parallelism"] + 2
    assert reads.knobs["read_parallelism"] > 4 and reads.knobs["deterministic"] is False
    assert "latency x throughput" in reads.reason
    fixed = apply_advice(SEED, advice)  # every knob is a real PipelineConfig field
    assert fixed.private_threadpool_size == reads.knobs["private_threadpool_size"] and fixed.cache == "memory"
    assert "--source records" in advice[0].command


def test_storage_advice_moves_gs_jpegs_to_the_pooled_reader(monkeypatch):
    """Where obstore is installed, JPEGs read through TF's gs:// (a TCP+TLS handshake per request)
    are advised onto the pooled reader, with its own reads in flight; TF-sized ones are not advised."""
    from stallscope.storage import gcs_obstore

    monkeypatch.setattr(gcs_obstore, "available", lambda: True)
    monkeypatch.setenv(sw.GCS_BLOCK_ENV, "1")
    what = _named("30ms,1Gbit", SEED)
    advice = storage_advice(what, SEED, data_bytes=10**8, memory_bytes=10**10, local_images_per_second=600)
    keys = [a.key for a in advice]
    assert keys == ["convert_records", "gcs_reader", "cache"]
    pooled = advice[1]
    assert pooled.knobs["gcs_reader"] == "pooled" and pooled.knobs["read_parallelism"] > 16
    fixed = apply_advice(SEED, advice)
    assert fixed.gcs_reader == "pooled" and fixed.read_parallelism == pooled.knobs["read_parallelism"]
    # its figure is the pooled client's own prediction at that store, above TF's client's best
    scenario = what.scenarios[0].scenario
    row = sw.predict_format(JPEG, scenario, sw.obstore_gcs_client(), fixed, WORKLOAD)
    tf_best = sw.predict_format(JPEG, scenario, sw.tf_gcs_client(), SEED, WORKLOAD).enough_in_flight
    assert f"{row.enough_in_flight.images_per_second:,.0f} images/s" in pooled.reason
    assert row.enough_in_flight.images_per_second > 1.1 * tf_best.images_per_second


def test_storage_advice_leaves_tfs_gcs_block_alone(monkeypatch):
    """The buffer costs what it receives, so a smaller block only adds requests (the emulator)."""
    monkeypatch.delenv(sw.GCS_BLOCK_ENV, raising=False)
    advice = storage_advice(_named("10ms,200Mbit", SEED), SEED, data_bytes=10**12, memory_bytes=10**10,
                            local_images_per_second=600)
    by_key = {a.key: a for a in advice}
    assert "gcs_block_size" not in by_key
    assert by_key["cache"].knobs == {} and "--cache file" in by_key["cache"].command  # too big for memory


def test_storage_advice_shrinks_tfs_gcs_block_for_shards_smaller_than_it(monkeypatch):
    """8 images of 100 kB a shard: every ranged GET of a 0.8 MB shard pays a 64 MB buffer (~46 ms), more
    CPU per image than the decode."""
    monkeypatch.delenv(sw.GCS_BLOCK_ENV, raising=False)
    small_shards = sw.IoPattern("records", 100_000, 1 / 8)
    what = _named("10ms,1Gbit", SEED, pattern=small_shards)
    advice = {a.key: a for a in storage_advice(what, SEED, data_bytes=10**12, memory_bytes=10**10,
                                               local_images_per_second=600)}
    assert "64 MB buffer" in advice["gcs_block_size"].reason and "convert_records" not in advice
    big_shards = sw.IoPattern("records", 100_000, 1 / 2000)  # 200 MB shards: the block is filled anyway
    what = _named("10ms,1Gbit", SEED, pattern=big_shards)
    assert "gcs_block_size" not in {a.key for a in storage_advice(
        what, SEED, data_bytes=10**12, memory_bytes=10**10, local_images_per_second=600)}


def test_no_storage_advice_without_a_named_store_or_when_the_store_keeps_up():
    assert storage_advice(sw.storage_whatif(JPEG, SEED, WORKLOAD), SEED, data_bytes=1, memory_bytes=10**10,
                          local_images_per_second=600) == []
    slow_device = dataclasses.replace(WORKLOAD, compute_ms=10_000.0)
    what = sw.storage_whatif(JPEG, SEED, slow_device, scenarios=sw.parse_scenarios("local-nvme"))
    assert storage_advice(what, SEED, data_bytes=1, memory_bytes=10**10, local_images_per_second=600) == []


def test_s3_pool_advice_past_its_default_connections():
    config = PipelineConfig(batch_size=10, map_parallelism=AUTOTUNE)
    advice = storage_advice(_named("100ms,10Gbit", config, client="s3fs"), config, data_bytes=1,
                            memory_bytes=10**10, local_images_per_second=600)
    pool = next(a for a in advice if a.key == "connection_reuse")
    assert "max_pool_connections" in pool.code


def test_storage_advice_replaces_a_plain_parallel_interleave():
    from stallscope.analysis.advice import Advice

    local = [Advice("parallel_interleave", "t", {"read_parallelism": AUTOTUNE}, "", "", ""),
             Advice("prefetch", "t", {"prefetch": AUTOTUNE}, "", "", "")]
    storage = [Advice("reads_in_flight", "t", {"read_parallelism": 9}, "", "", "")]
    assert [a.key for a in merge_advice(local, storage)] == ["reads_in_flight", "prefetch"]
    assert [a.key for a in merge_advice(local, [])] == ["parallel_interleave", "prefetch"]


def test_text_markdown_and_html_show_the_figures_and_the_table():
    from html.parser import HTMLParser

    from stallscope.report.html import storage_html
    from stallscope.report.markdown import storage_markdown
    from stallscope.report.text import storage_lines

    what = _named("10ms,200Mbit", SEED)
    figures = storage_figures(JPEG, sw.tf_gcs_client(1), wait_ms_per_image=0.25, read_calls=2.12, files_opened=1.0)
    text = "\n".join(storage_lines(figures, what))
    assert "modelled for tf-gcs" in text and "2.12 read calls" in text and "0.25 ms waiting" in text
    assert "files (yours)" in text and "records" in text
    markdown = storage_markdown(figures, what)
    table = [line for line in markdown if line.startswith("| 10ms,200Mbit")]
    assert len(table) == 2 and all(line.count("|") == 8 for line in table)

    class Cells(HTMLParser):
        rows: list = []

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])

        def handle_data(self, data):
            if self.rows and self.lasttag == "td":
                self.rows[-1].append(data)

    parser = Cells()
    parser.feed(storage_html(figures, what))
    body = [row for row in parser.rows if row]
    assert len(body) == 2 and body[0][0] == "10ms,200Mbit" and body[1][1] == "records"


def test_tfs_gcs_buffer_is_a_whole_block_per_request_only_for_streamed_reads():
    """A TFRecord shard is read in pieces (a 64 MB buffer per GET); a JPEG in one read of its size."""
    scenario = sw.StorageScenario("x", 0.0, math.inf)
    shard = sw.IoPattern("records", 20_000, 1 / 32)
    jpeg = sw.IoPattern("files", 20_000, 1.0)
    gcs = sw.tf_gcs_client(64)
    per_request, per_mib = gcs.request_cpu_ms, gcs.transfer_cpu_ms_per_mib
    assert gcs.block_buffer_cpu_ms_per_mib == pytest.approx(0.711)
    assert sw.costs(shard, scenario, gcs, cpu_ms_per_image=0).client_cpu_ms == pytest.approx(
        (per_request + 0.711 * 64) / 32 + 20_000 / sw.MIB * per_mib)
    assert sw.costs(jpeg, scenario, gcs, cpu_ms_per_image=0).client_cpu_ms == pytest.approx(
        per_request + 20_000 / sw.MIB * per_mib)
