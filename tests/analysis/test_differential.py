"""Differential diagnosis on tiny generated workloads against an emulated accelerator.

Each workload has a known cause built in through the builder's hooks: a source stage that sleeps per
element (slow storage, no CPU), a decode followed by heavy CPU work, or a pipeline far faster than
the device. The diagnosis must name it from its probes.
"""

from __future__ import annotations

import time

import pytest

from stallscope.analysis import differential
from stallscope.analysis.differential import DiagnoseOptions, PipelineBreakdown, attribute, diagnose
from stallscope.analysis.probes import pipeline_threads
from stallscope.config import AUTOTUNE
from stallscope.errors import UsageError
from stallscope.pipeline.presets import get_preset
from stallscope.tfimport import import_tensorflow
from stallscope.workload.train import TrainOptions

from .conftest import loop_probe

tf = import_tensorflow()

SMALL = get_preset("seed").replace(batch_size=4, image_size=32, shuffle_buffer=0)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """48 small JPEGs in 3 classes: enough elements that one-off start-up work stays small."""
    from stallscope.data.folders import scan_tree

    root = tmp_path_factory.mktemp("diagnose_tree")
    _write_tree(root)
    assert len(scan_tree(root).files) == 48
    return root


def _write_tree(root):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(3):
        folder = root / f"class_{c}"
        folder.mkdir()
        for i in range(16):
            pixels = rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"img_{i:02d}.jpg", quality=85)


def _options(tree, config, accelerator, **kwargs) -> DiagnoseOptions:
    train = TrainOptions(source="files", dataset_path=tree, pipeline=config, accelerator=accelerator)
    kwargs.setdefault("probe_steps", 6)
    kwargs.setdefault("pipeline_budget_s", 5.0)
    return DiagnoseOptions(train=train, **kwargs)


def slow_source(dataset):
    """A read stage that waits 20 ms per element without using the CPU (a slow disk or network)."""
    def wait(encoded):
        time.sleep(0.020)
        return encoded

    def stage(encoded, label, where):
        slow = tf.numpy_function(wait, [encoded], tf.string, stateful=True)
        return tf.ensure_shape(slow, []), label, where

    return dataset.map(stage)


def heavy_cpu(dataset):
    """Sequential CPU work after decoding: a 320x320 matrix product per image."""
    def stage(image, label):
        matrix = tf.random.uniform([320, 320])
        busy = tf.reduce_mean(tf.linalg.matmul(matrix, matrix))
        return image + 0.0 * busy, label

    return dataset.map(stage)


def test_slow_source_is_a_fetch_stall_in_every_phase(tree):
    options = _options(tree, SMALL, "emulated:1ms", extra_stages={"after_read": slow_source},
                       phases=("head", "full"))
    result = diagnose(options)
    assert [p.phase for p in result.phases] == ["head", "full"]
    for phase in result.phases:
        assert phase.verdict == "highly"
        assert phase.cause == "fetch"
        assert phase.fetch_stall_ms > 2 * phase.preprocessing_stall_ms
        # 4 images x 20 ms of waiting per batch, most of it shows as input wait
        assert phase.fetch_stall_ms > 40.0
    parts = result.pipeline_breakdown
    assert parts.waiting_ms > parts.cpu_ms
    assert any(a.key == "parallel_interleave" for a in result.advice)
    assert result.warm.io_per_image.files_opened == pytest.approx(1.0)
    data = result.to_dict()
    assert data["cause"] == "fetch" and 0.2 <= data["input_share"] <= 1.0


def test_heavy_sequential_map_is_a_preprocessing_stall(tree):
    options = _options(tree, SMALL, "emulated:1ms", extra_stages={"after_decode": heavy_cpu})
    result = diagnose(options)
    phase = result.phases[0]
    assert phase.verdict == "highly"
    assert phase.cause == "preprocessing"
    assert phase.preprocessing_stall_ms > phase.fetch_stall_ms
    assert result.pipeline_breakdown.cpu_ms > result.pipeline_breakdown.waiting_ms
    keys = [a.key for a in result.advice]
    # a parallel map gains only where a core is free: on a machine kept busy by others it is only checked
    busy = result.warm.other_cores_busy >= 0.5
    assert "parallel_map" in keys or (busy and any("Decode in parallel" in n for n in result.notes))
    assert "prefetch" in keys or any("Prefetch at the end" in n for n in result.notes)
    # more cores help a CPU-bound pipeline once its stages are parallel
    rates = [row.pipeline_images_per_second for row in phase.cores]
    assert rates == sorted(rates) and rates[-1] > rates[0]


def test_healthy_pipeline_is_not_input_bound(tree):
    config = SMALL.replace(map_parallelism=AUTOTUNE, prefetch=AUTOTUNE)
    # 16 steps of 100 ms: one step slowed by a loaded machine is not 5% of them
    options = _options(tree, config, "emulated:100ms", probe_steps=16)
    result = diagnose(options)
    phase = result.phases[0]
    assert phase.verdict == "not"
    assert phase.cause == "none"
    assert phase.input_share < 0.05
    assert phase.compute_ms == pytest.approx(100.0, rel=0.2)
    assert not any(a.knobs for a in result.advice)
    # the same pipeline against much faster devices turns input-bound past its knee
    fastest = phase.devices[-1]
    assert fastest.device_images_per_second > phase.knee_images_per_second
    assert fastest.prediction.input_share > 0.0


def test_attribution_splits_the_measured_wait_by_cpu_and_waiting():
    parts = PipelineBreakdown(warm_ms=40.0, cold_ms=60.0, cpu_ms=30.0, waiting_ms=10.0, storage_ms=20.0,
                              threads=1.0, cpu_ms_per_image=30.0 / 32)
    compute = loop_probe("compute", 10.0, 0.0, 10.0)
    serial = loop_probe("end_to_end", 50.0, 40.0, 10.0)   # 10 + 40: no overlap
    warm = attribute(compute=compute, end_to_end=serial, parts=parts, batch_size=32, cores=2, phase="head")
    assert not warm.overlapped
    assert warm.preprocessing_stall_ms == pytest.approx(30.0)
    assert warm.fetch_stall_ms == pytest.approx(10.0)
    assert warm.cold_fetch_stall_ms == pytest.approx(30.0)   # + 20 ms of storage reads per batch
    assert warm.cause == "preprocessing" and warm.verdict == "highly"
    cold = attribute(compute=compute, end_to_end=serial, parts=parts, batch_size=32, cores=2, phase="head",
                     steady_cache="cold")
    assert cold.fetch_stall_ms == pytest.approx(30.0)
    assert cold.step_ms == pytest.approx(70.0)
    assert cold.input_share == pytest.approx(60.0 / 70.0)
    assert cold.cause == "fetch" or cold.preprocessing_stall_ms >= cold.fetch_stall_ms
    overlapped = loop_probe("end_to_end", 41.0, 31.0, 10.0)   # max(10, 40): overlapped
    assert attribute(compute=compute, end_to_end=overlapped, parts=parts, batch_size=32, cores=2,
                     phase="head").overlapped


def test_pipeline_threads_follow_the_parallel_stages():
    assert pipeline_threads(SMALL, 8) == 1.0
    assert pipeline_threads(SMALL.replace(map_parallelism=AUTOTUNE), 8) == 8.0
    assert pipeline_threads(SMALL.replace(map_parallelism=3), 8) == 3.0
    assert pipeline_threads(SMALL.replace(read_parallelism=16), 2) == 2.0
    assert pipeline_threads(SMALL.replace(map_parallelism=AUTOTUNE, private_threadpool_size=2), 8) == 2.0


def test_probe_windows_hold_whole_epochs_on_small_data(tree):
    options = _options(tree, SMALL, "emulated:1ms", probe_steps=20)
    assert differential.measured_steps(options, 48) == 24   # 12 steps per epoch, 2 epochs
    assert differential.measured_steps(options, 10_000) == 20


def test_the_pipeline_probe_of_a_small_data_set_runs_long_enough_for_a_steady_pace(tree):
    from stallscope.analysis.probes import probe_pipeline
    from stallscope.pipeline.sources import open_source

    source = open_source("files", tree)
    config = SMALL.replace(batch_size=48)  # one pass is one batch: no pace past the first
    one_pass = probe_pipeline(config, source, cache_state="warm", max_images=48, budget_s=30.0)
    assert one_pass.steady_ms_per_image is None
    longer = probe_pipeline(config, source, cache_state="warm", max_images=48, budget_s=30.0, min_s=0.3)
    assert longer.seconds >= 0.3 and longer.images > 48 and longer.steady_ms_per_image > 0
    cut = probe_pipeline(config, source, cache_state="warm", max_images=48, budget_s=0.01, min_s=5.0)
    assert cut.seconds < 5.0  # the budget still ends it


def test_options_are_validated_by_name(tree):
    with pytest.raises(UsageError, match="probe-steps"):
        _options(tree, SMALL, "emulated:1ms", probe_steps=1)
    with pytest.raises(UsageError, match="fine-tune"):
        _options(tree, SMALL, "emulated:1ms", phases=("half",))
    with pytest.raises(UsageError, match="steady_cache"):
        _options(tree, SMALL, "emulated:1ms", steady_cache="lukewarm")


def test_json_never_holds_infinity():
    assert differential.finite({"a": float("inf"), "b": [1.0, float("nan")], "c": "x"}) == \
        {"a": None, "b": [1.0, None], "c": "x"}


def _warm_probe(*, cores, other_cores_busy, batch_size=32):
    from stallscope.analysis.probes import PipelineProbe

    # 320 images in 1.2 s on one thread, 1.0 s of CPU: a sequential, CPU-bound decode
    return PipelineProbe(cache_state="warm", batches=10, images=320, seconds=1.2, cpu_seconds=1.0,
                         run_queue_seconds=0.0, cores=cores, other_cores_busy=other_cores_busy,
                         cached_before=1.0, io=None, io_per_image=None, batch_size=batch_size)


def test_fix_prediction_is_the_more_cores_what_if_of_the_same_free_cores():
    """On a machine where others keep a core busy, `diagnose --fix`'s predicted column and the
    what-if's '+0 cores' row are one computation on the same free cores (they differed 2x: one
    counted every core, the other only the free ones)."""
    seed = get_preset("seed").replace(batch_size=32)
    fixed = seed.replace(map_parallelism=AUTOTUNE, prefetch=AUTOTUNE)
    warm = _warm_probe(cores=4, other_cores_busy=2.0)
    parts = differential.breakdown(warm, None, seed)
    cores = differential.free_cores(warm)
    assert cores == 2.0
    phase = attribute(compute=loop_probe("compute", 10.0, 0.0, 10.0), end_to_end=loop_probe("end_to_end", 130.0, 120.0, 10.0),
                      parts=parts, batch_size=32, cores=cores, phase="head")
    predicted = differential.predict_fixed(phase, parts, fixed, cores=cores)
    plus_zero = phase.cores[0]
    assert plus_zero.extra_cores == 0 and plus_zero.cores == cores
    assert predicted.images_per_second == pytest.approx(plus_zero.prediction.images_per_second)
    assert predicted.input_share == pytest.approx(plus_zero.prediction.input_share)
    # a fix that stays sequential (prefetch only) is predicted on one thread, below the what-if
    prefetch_only = differential.predict_fixed(phase, parts, seed.replace(prefetch=AUTOTUNE), cores=cores)
    assert prefetch_only.images_per_second < predicted.images_per_second


def test_advice_is_spelled_as_the_flags_a_user_types():
    from stallscope.analysis.advice import Advice
    from stallscope.report.text import fmt_knobs

    advice = Advice("parallel_interleave", "Read files in parallel", {"read_parallelism": AUTOTUNE,
                                                                      "deterministic": False}, "", "", "")
    assert fmt_knobs(advice.knobs) == "--read-parallelism autotune, --deterministic false"
    assert fmt_knobs({"cache": "memory", "max_intra_op_parallelism": 1}) == "--cache memory, --max-intra-op-parallelism 1"


def test_free_cores_under_a_quota_below_one_cpu():
    """A quarter-CPU quota gives the pipeline a quarter of a core, not the one core the floor used to give."""
    assert differential.free_cores(_warm_probe(cores=0.25, other_cores_busy=0.0)) == 0.25
    assert differential.free_cores(_warm_probe(cores=2.0, other_cores_busy=1.5)) == 1.0  # others busy: one core left
    assert differential.free_cores(_warm_probe(cores=2.0, other_cores_busy=0.5)) == 1.5


def test_a_pipeline_probe_held_back_by_its_quota_is_advised_the_quotas_cores():
    """diagnose's advice where the pipeline-alone probe ran out of a 1-CPU quota on 4 CPUs (the same
    advice a real cgroup gives in test_diagnose_cli; this one runs where no cgroup can be made)."""
    import dataclasses

    seed = get_preset("seed").replace(batch_size=32)
    warm = dataclasses.replace(_warm_probe(cores=1.0, other_cores_busy=0.0), cpus=4, throttled_share=0.8)
    parts = differential.breakdown(warm, None, seed)
    phase = attribute(compute=loop_probe("compute", 10.0, 0.0, 10.0), end_to_end=loop_probe("end_to_end", 130.0, 120.0, 10.0),
                      parts=parts, batch_size=32, cores=1.0, phase="head")
    advice = differential.recommend((phase,), seed, parts, examples=1000, data_bytes=10**6, warm=warm)
    pool = next(a for a in advice if a.key == "quota_pool")
    assert pool.knobs == {"private_threadpool_size": 1}
    assert "the CPU quota (1 CPU's worth, on 4 CPUs) ran out in 80% of its periods" in pool.evidence
    calm = dataclasses.replace(warm, throttled_share=0.01)
    assert "quota_pool" not in [a.key for a in differential.recommend(
        (phase,), seed, parts, examples=1000, data_bytes=10**6, warm=calm)]


def test_a_shuffle_of_decoded_images_refilling_each_epoch_is_probed_over_whole_epochs(tree):
    """The seed's shuffle of decoded images holds the whole data set and refills at each epoch start.
    A window of 6 steps inside a 24-step epoch is served from the full buffer and read almost no wait
    (the fault this guards against: the seed on 480 images in batches of 8 read 9.6% in 20 steps,
    83% over a 300-step run); the window is now the whole epoch, with its refill."""
    refilling = SMALL.replace(batch_size=2, shuffle_buffer=48)  # 24 steps per epoch, the whole set in the buffer
    options = _options(tree, refilling, "emulated:1ms", extra_stages={"after_decode": slow_source_decoded},
                       cold_cache=False)
    assert differential.measured_steps(options, 48) == 24
    result = diagnose(options)
    phase = result.phases[0]
    assert phase.end_to_end.steps == 24
    assert phase.verdict == "highly" and phase.input_share > 0.5, phase
    assert not any("holds no epoch start" in note for note in result.notes)


def slow_source_decoded(dataset):
    """5 ms of waiting per decoded image, before the shuffle: each epoch's refill of 48 takes 240 ms."""
    def wait(image):
        time.sleep(0.005)
        return image

    def stage(image, label):
        return tf.ensure_shape(tf.numpy_function(wait, [image], tf.float32, stateful=False), image.shape), label

    return dataset.map(stage)


def test_the_window_is_an_epoch_where_a_refill_matters_and_an_epoch_is_affordable(tree):
    seed = get_preset("seed")  # a shuffle of 10,240 decoded images, batches of 32
    options = _options(tree, seed, "emulated:1ms", probe_steps=20)
    assert differential.measured_steps(options, 480) == 15            # a short epoch: whole, as before
    assert differential.measured_steps(options, 10_000) == 313        # the buffer holds the epoch: one whole epoch
    assert differential.measured_steps(options, 100_000) == 20        # 3,125 steps: too long to probe whole
    assert differential.measured_steps(options, 10_000, step_ms=150.0) == 313   # 47 s an epoch: affordable
    assert differential.measured_steps(options, 10_000, step_ms=1000.0) == 20   # a real model on a CPU: 5 min
    encoded = _options(tree, seed.replace(shuffle_at="encoded"), "emulated:1ms", probe_steps=20)
    assert differential.measured_steps(encoded, 10_000) == 20         # no refill of decoded images
    assert differential.epoch_refill_images(seed, 480) == 480
    assert differential.epoch_refill_images(seed.replace(shuffle_buffer=0), 480) == 0
    # TF's shuffle-and-repeat fusion (on unless turned off, as seed turns it off) keeps the buffer from one
    # epoch into the next where it is no larger than the epoch: no refill, no whole-epoch window
    fused = seed.replace(shuffle_and_repeat_fusion=None)
    assert differential.epoch_refill_images(fused, 50_000) == 0
    assert differential.epoch_refill_images(fused, 5_000) == 5_000        # a buffer beyond the epoch still refills
    assert differential.measured_steps(_options(tree, fused, "emulated:1ms", probe_steps=20), 50_000) == 20
    assert differential.measured_steps(_options(tree, seed, "emulated:1ms", probe_steps=20), 50_000) == 20  # 1,563 steps
    assert differential.measured_steps(_options(tree, seed, "emulated:1ms", probe_steps=20), 20_000) == 625
    assert differential.measured_steps(_options(tree, fused, "emulated:1ms", probe_steps=20), 20_000) == 20
    warm = _warm_probe(cores=2.0, other_cores_busy=0.0)  # 3.75 ms per image
    note = differential.refill_note(seed, 100_000, warm, 20)
    assert "holds no epoch start" in note and "10,240 images" in note and "38.4 s" in note and "--probe-steps 3125" in note
    assert differential.refill_note(seed, 10_000, warm, 313) is None
    assert "holds no epoch start" in differential.refill_note(seed, 10_000, warm, 20)
