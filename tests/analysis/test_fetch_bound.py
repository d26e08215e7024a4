"""A run that waits on a remote store's latency is named latency-bound, with one verdict per run.

A real `stallscope train --pipeline seed` reads a tiny JPEG tree from an emulated gs:// bucket with 30 ms
per request, against an emulated device fast enough that the reads dominate by construction. The seed
pipeline shuffles after reading with a buffer larger than the data set, so every epoch's first step
waits for the whole tree to be read one file at a time, and the steps between are served from the
filled buffer. The profiled window (steps 3..6) holds only served steps; the run's own steps.csv holds
the refills. The process itself decodes 24 small images per epoch: nearly idle while it waits.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stallscope.analysis.analyze import analyze_run
from stallscope.analysis.fetch_wait import FetchWait, fetch_wait
from stallscope.analysis.cpu_window import CpuWindow
from stallscope.report.text import render_text
from stallscope.storage.emulator import emulate

LATENCY_S = 0.03
BATCH = 4          # the tiny tree's 24 images: 6 steps per epoch, a refill at steps 7, 13 and 19
STEPS = 20


@pytest.fixture(scope="module")
def fetch_bound_run(tmp_path_factory, tiny_tree):
    run = tmp_path_factory.mktemp("fetch_bound") / "run"
    with emulate(tiny_tree, kind="gcs", latency_s=LATENCY_S, max_duration_s=600) as store:
        env = dict(os.environ, **store.env)
        done = subprocess.run(
            [sys.executable, "-m", "stallscope", "train", "--dataset-path", store.url, "--pipeline", "seed",
             "--accelerator", "emulated:4000", "--batch-size", str(BATCH), "--steps", str(STEPS),
             "--log-path", str(run), "--profile-steps", "3:6"],
            env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stderr[-2000:]
    return run


@pytest.mark.timeout(480)
def test_a_latency_bound_run_is_named_fetch_with_the_stores_latency(fetch_bound_run):
    analysis = analyze_run(fetch_bound_run, with_xprof=False)
    # one verdict per run: the run's own steps (the refills included), not the window served from the buffer
    assert analysis.headline_from == "steps.csv"
    assert analysis.input_share == analysis.run.input_share and analysis.verdict == "highly"
    assert analysis.fetch is not None and analysis.bottleneck == "fetch"
    assert analysis.fetch.store.startswith("gs://") and analysis.fetch.request_ms >= LATENCY_S * 1000
    text = render_text(analysis)
    headline = text.splitlines()[text.splitlines().index("") + 1]
    assert headline.startswith("Input share") and "latency-bound, fetch: " in headline, headline
    assert f"{analysis.fetch.request_ms:.1f} ms per request on gs://" in headline, headline
    assert "the run's own steps" in headline and "the CPU is the limit" not in text
    if analysis.window_disagrees:  # the other figure is beside it, with why they differ
        assert "the profiled window's" in headline and "filled buffer" in headline, headline
    # the advice for reads in flight applies, priced on the run's own steps
    assert analysis.advice and analysis.advice[0].key == "fetch_in_flight", [a.key for a in analysis.advice]
    assert analysis.advice[0].knobs["read_parallelism"] >= 2
    assert "data_service" not in {a.key for a in (*analysis.advice, *analysis.checked)}
    data = analysis.to_dict()
    assert data["bottleneck"] == "fetch" and data["input_share_from"] == "steps.csv"


def _window(process_cores: float) -> CpuWindow:
    return CpuWindow(mean_percent=100.0, max_percent=100.0, samples=20, start_s=1.0, end_s=6.0, cores=2.0,
                     process_cores=process_cores)


SUMMARY = {"source": {"kind": "files", "path": "gs://data", "storage": {"kind": "gs", "label": "gs:// bucket"}},
           "store_latency": {"p50_ms": 20.0}, "fetched": {"requests_per_image": 1.0}}


def test_fetch_needs_an_idle_process_and_a_remote_store():
    named = fetch_wait(SUMMARY, _window(0.05), input_share=0.97, wait_ms=75.0, batch_size=4, stage=None)
    assert isinstance(named, FetchWait) and named.fetch_ms_per_step == 80.0
    # the process busy on its own work for the wait: CPU, not fetch
    assert fetch_wait(SUMMARY, _window(1.8), input_share=0.97, wait_ms=75.0, batch_size=4, stage=None) is None
    local = dict(SUMMARY, source=dict(SUMMARY["source"], storage={"kind": "local", "label": "local disk"}))
    assert fetch_wait(local, _window(0.05), input_share=0.97, wait_ms=75.0, batch_size=4, stage=None) is None
    # the requests, even one at a time, explain under half the wait: not named fetch
    assert fetch_wait(SUMMARY, _window(0.05), input_share=0.97, wait_ms=400.0, batch_size=4, stage=None) is None



def test_the_decoded_cache_claims_the_cpu_limit_only_with_cpu_figures(stalled_profile):
    """A bare profile has no CPU samples: the cache advice says what it assumes, not that the CPU is the limit."""
    from stallscope.analysis.advice import _decoded_cache

    analysis = analyze_run(stalled_profile, with_xprof=False)
    assert {c.key: c for c in analysis.checklist}["cpu_saturated"].answer == "unknown"
    bare = _decoded_cache(analysis, "evidence", cpu_limits=False, cpu_said="unknown").reason
    assert "the CPU is the limit" not in bare and bare.startswith("assumed, with no CPU figures here"), bare
    assert "the CPU is the limit" in _decoded_cache(analysis, "evidence", cpu_limits=True, cpu_said="yes").reason


def test_a_sweeps_bottleneck_column_blames_fetch_as_analyze_does(fetch_bound_run):
    """The sweep's bottleneck column said BatchV2 for all 20 seed cells (the stage a filled buffer's window
    stops at) while `analyze` of their runs names the reads: the column takes analyze's own word."""
    from stallscope.sweep.results import _profile_stages

    slowest, blamed = _profile_stages(fetch_bound_run)
    analysis = analyze_run(fetch_bound_run, with_xprof=False)
    assert (slowest, blamed) == (analysis.slowest_stage, "fetch") and slowest != "fetch"
