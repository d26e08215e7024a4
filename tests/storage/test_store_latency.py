"""The emulator times every request it serves, whichever client asks: a run on it reports p50/p90/p99
and the histogram (store_latency), and counts its requests and bytes per step at the store; the mount
serves more than libfuse's default 10 calls at once."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.fuse_mount import why_no_fuse
from stallscope.storage.served_counters import counters_file_for, latency_summary
from stallscope.workload import rundir

from .test_emulator import LIMIT_S

WHY_NO_FUSE = why_no_fuse()
needs_fuse = pytest.mark.skipif(bool(WHY_NO_FUSE), reason=f"needs a FUSE mount: {WHY_NO_FUSE}")


def test_percentiles_come_from_the_buckets():
    edges = (1.0, 2.0, 4.0, 8.0)
    summary = latency_summary(edges, [0, 50, 40, 10, 0])  # 50 in (1, 2] ms, 40 in (2, 4], 10 in (4, 8]
    assert summary["requests"] == 100
    assert 1.0 < summary["p50_ms"] <= 2.0 and 2.0 < summary["p90_ms"] <= 4.0 and 4.0 < summary["p99_ms"] <= 8.0
    assert summary["histogram"] == [{"up_to_ms": 2.0, "requests": 50}, {"up_to_ms": 4.0, "requests": 40},
                                    {"up_to_ms": 8.0, "requests": 10}]
    assert latency_summary(edges, [0] * 5) is None


def _train(path, tmp_path, make_pipeline=None):
    from stallscope.pipeline.presets import get_preset
    from stallscope.workload.train import TrainOptions, run_training

    pipeline = get_preset("tuned").replace(image_size=32, batch_size=4, shuffle_buffer=16)
    return run_training(TrainOptions(source="files", dataset_path=path, pipeline=pipeline, steps=6,
                                     accelerator="emulated:5ms", log_path=tmp_path / "run"))


def _check_store_figures(result, store, latency_ms: float):
    summary = result.summary
    fetched, latency = summary["fetched"], summary["store_latency"]
    assert summary["step_io"]["basis"] == "store" and fetched["basis"] == "store"
    served = store.counters()
    assert 0 < fetched["requests"] <= served.requests and 0 < fetched["bytes"] <= served.bytes
    assert fetched["images_trained"] == 24 and fetched["requests_per_image"] == fetched["requests"] / 24
    assert latency["requests"] >= fetched["requests"] * 0.9  # nearly every request served was timed
    assert latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"]
    assert min(bucket["up_to_ms"] for bucket in latency["histogram"]) >= latency_ms  # each waited the latency
    steps = rundir.read_steps(result.run_dir)
    assert all(s.requests is not None for s in steps) and sum(s.requests for s in steps) > 0


def test_a_run_on_the_s3_store_reports_the_latency_the_store_saw(served, tmp_path, monkeypatch):
    with emulate(served, kind="s3", latency_s=0.005, max_duration_s=LIMIT_S) as store:
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        assert counters_file_for(f"{store.url}/tree") is not None
        result = _train(f"{store.url}/tree", tmp_path)
        _check_store_figures(result, store, 5.0)


@needs_fuse
def test_a_run_on_the_mount_reports_the_latency_the_store_saw(served, tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    with emulate(served, kind="mount", mount_point=mount, latency_s=0.005, max_duration_s=LIMIT_S) as store:
        assert counters_file_for(mount / "tree") is not None  # found by the mount's source name
        result = _train(mount / "tree", tmp_path)
        _check_store_figures(result, store, 5.0)


@needs_fuse
def test_the_mount_serves_more_than_ten_calls_at_once(served, tmp_path):
    """24 opens held 0.5 s each: libfuse starts a thread per call waiting, past its default of 10."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    with emulate(served, kind="mount", mount_point=mount, latency_s=0.5, max_duration_s=LIMIT_S) as store:
        files = sorted((mount / "tree").rglob("*.jpg"))  # listing pays the latency too; done before the burst
        server = psutil.Process(store.pid)
        before = server.num_threads()
        openers = [threading.Thread(target=lambda p=p: os.close(os.open(p, os.O_RDONLY))) for p in files[:32]]
        for opener in openers:
            opener.start()
        most = before
        deadline = time.monotonic() + 10
        while any(t.is_alive() for t in openers) and time.monotonic() < deadline:
            most = max(most, server.num_threads())
            time.sleep(0.05)
        for opener in openers:
            opener.join(10)
    assert len(files) >= 24
    assert most - before > 10
