"""Tiny profiled training loops for the analysis tests: real tf.data pipelines, real TF profiles.

Each loop iterates a `tf.data` pipeline under `tf.profiler.experimental` with a step marker per
step (`Trace('train', step_num=i, _r=1)`, as `stallscope train` writes them) and sleeps a fixed
time per step in place of the device. TF's static rewrites are off unless asked for, so the
pipeline that runs is the one written here. Profiles are made once per test session.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

STEPS = 24
DEVICE_S = 0.008      # the emulated device step
SLOW_S = 0.003        # per element of the "decode" function: 4 per batch -> 12 ms per batch sequentially
BATCH = 4
# The healthy loop's device step: long enough that a loaded machine's scheduling hiccups in get_next stay
# far under the 5% that makes a loop "moderately" input-bound. With two busy loops on 2 cores single waits
# of 5-8 ms were measured, several in a window: against 30 ms that reached 4%, against 250 ms it is < 0.5%.
HEALTHY_DEVICE_S = 0.25


def _slow_decode(x):
    import tensorflow as tf

    def work(value):
        time.sleep(SLOW_S)
        return value

    return tf.numpy_function(work, [x], tf.int64, stateful=False)


def _slow_generator():
    for value in range(10_000):
        time.sleep(SLOW_S)
        yield value


def build_pipeline(kind: str, *, rewrites: bool = False):
    """`stalled`: sequential slow map, no prefetch. `parallel`: the same map with 3 parallel calls
    and a prefetch. `healthy`: cheap map + prefetch. `generator`: a Python generator as slow per
    element as the stalled map, batched, no prefetch; `generator_cached`: the same with a cache after
    the generator (the profile is of the epoch that fills it). `map_and_batch`: the parallel map fused
    into its batch by TF (MapAndBatch, asynchronous), no prefetch."""
    import tensorflow as tf

    dataset = tf.data.Dataset.range(10_000)
    if kind in ("generator", "generator_cached"):
        dataset = tf.data.Dataset.from_generator(_slow_generator, output_signature=tf.TensorSpec([], tf.int64))
        dataset = (dataset.cache() if kind == "generator_cached" else dataset).batch(BATCH)
    elif kind == "map_and_batch":   # TF fuses the parallel map into the batch: an asynchronous last stage
        dataset = dataset.map(_slow_decode, num_parallel_calls=3).batch(BATCH)
    elif kind == "stalled":
        dataset = dataset.map(_slow_decode).batch(BATCH)
    elif kind == "parallel":
        dataset = dataset.map(_slow_decode, num_parallel_calls=3).batch(BATCH).prefetch(2)
    elif kind == "healthy":
        dataset = dataset.map(lambda x: x * 2).batch(BATCH).prefetch(4)
    else:
        raise ValueError(kind)
    if not rewrites:
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_and_batch_fusion = kind == "map_and_batch"
        dataset = dataset.with_options(options)
    return dataset


def profiled_loop(log_dir: Path, dataset, *, steps: int = STEPS, device_s: float = DEVICE_S, profile: bool = True,
                  fetch_inside: bool = True, xprof_marks: bool = True):
    """Runs `steps` steps (get_next + device sleep), profiling them; returns per-step StepRecords.
    `fetch_inside=False` fetches each batch before the step marker opens, as `for x in dataset:` does.
    `xprof_marks=False` numbers the markers without `_r=1`, as Keras' 'Profiled batch' spans are: XProf
    then finds no steps."""
    import tensorflow as tf

    from stallscope.workload.rundir import StepRecord

    iterator = iter(dataset)
    next(iterator)  # the first element builds the pipeline's threads; not a step
    records = []
    if profile:
        tf.profiler.experimental.start(str(log_dir))
    origin = time.perf_counter()
    try:
        for step in range(steps):
            early = None if fetch_inside else next(iterator)
            with tf.profiler.experimental.Trace("train", step_num=step, **({"_r": 1} if xprof_marks else {})):
                started = time.perf_counter()
                batch = next(iterator) if fetch_inside else early
                got = time.perf_counter()
                time.sleep(device_s)
                done = time.perf_counter()
            records.append(StepRecord(
                step=step + 1, phase="train", started_s=started - origin, step_ms=(done - started) * 1e3,
                input_wait_ms=(got - started) * 1e3, compute_ms=(done - got) * 1e3,
                images=int(batch.shape[0]), warmup=step == 0,
            ))
    finally:
        if profile:
            tf.profiler.experimental.stop()
    return records


def write_run_dir(run_dir: Path, kind: str, *, rewrites: bool = False) -> Path:
    """A run directory as `stallscope train` lays it out: profile, steps.csv, pipeline.json, resources.json."""
    from stallscope.pipeline.describe import pipeline_as_built, pipeline_as_run
    from stallscope.workload import rundir
    from stallscope.workload.resources import ResourceMonitor

    run_dir.mkdir(parents=True, exist_ok=True)
    dataset = build_pipeline(kind, rewrites=rewrites)
    with ResourceMonitor(interval_s=0.05) as monitor:
        records = profiled_loop(run_dir, dataset)
    rundir.write_steps(run_dir, records)
    rundir.write_json(run_dir, rundir.PIPELINE_NAME, {
        "requested": None, "written": pipeline_as_built(dataset), "ran": pipeline_as_run(dataset)})
    rundir.write_json(run_dir, rundir.RESOURCES_NAME, monitor.report.to_dict())
    return run_dir


@pytest.fixture(scope="session")
def stalled_profile(tmp_path_factory) -> Path:
    """A bare profile directory (no run files): sequential slow map, no prefetch."""
    log_dir = tmp_path_factory.mktemp("stalled")
    profiled_loop(log_dir, build_pipeline("stalled"))
    return log_dir


@pytest.fixture(scope="session")
def healthy_profile(tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("healthy")
    profiled_loop(log_dir, build_pipeline("healthy"), device_s=HEALTHY_DEVICE_S)
    return log_dir


@pytest.fixture(scope="session")
def parallel_profile(tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("parallel")
    profiled_loop(log_dir, build_pipeline("parallel"))
    return log_dir


@pytest.fixture(scope="session")
def fetched_outside_profile(tmp_path_factory) -> Path:
    """The stalled pipeline iterated as `for x in dataset: with step(i): ...`: each batch is fetched
    before its step marker opens, so the steps hold no IteratorGetNext."""
    log_dir = tmp_path_factory.mktemp("outside")
    profiled_loop(log_dir, build_pipeline("stalled"), steps=12, fetch_inside=False)
    return log_dir


@pytest.fixture(scope="session")
def generator_profile(tmp_path_factory) -> Path:
    """A bare profile whose source is a slow Python generator (Dataset.from_generator)."""
    log_dir = tmp_path_factory.mktemp("generator")
    profiled_loop(log_dir, build_pipeline("generator"), steps=12)
    return log_dir


@pytest.fixture(scope="session")
def stalled_run(tmp_path_factory) -> Path:
    """A full run directory of the stalled pipeline as written (steps.csv, resources.json with CPU samples)."""
    return write_run_dir(tmp_path_factory.mktemp("stalled-run") / "run", "stalled")


@pytest.fixture(scope="session")
def rewritten_run(tmp_path_factory) -> Path:
    """A full run directory of the stalled pipeline with TF's default rewrites left on."""
    return write_run_dir(tmp_path_factory.mktemp("rewritten") / "run", "stalled", rewrites=True)


@pytest.fixture(scope="session")
def generator_cached_profile(tmp_path_factory) -> Path:
    """The slow generator with a cache after it: the profiled epoch is the one that fills the cache."""
    log_dir = tmp_path_factory.mktemp("generator-cached")
    profiled_loop(log_dir, build_pipeline("generator_cached"), steps=12)
    return log_dir


@pytest.fixture(scope="session")
def map_and_batch_profile(tmp_path_factory) -> Path:
    """The slow map made parallel and fused into its batch (MapAndBatch, asynchronous), no prefetch."""
    log_dir = tmp_path_factory.mktemp("map-and-batch")
    profiled_loop(log_dir, build_pipeline("map_and_batch"), steps=12)
    return log_dir


@pytest.fixture(scope="session")
def few_steps_profile(tmp_path_factory) -> Path:
    """Three marked steps of the stalled loop: the first and last are left out, one step is counted."""
    log_dir = tmp_path_factory.mktemp("few-steps")
    profiled_loop(log_dir, build_pipeline("stalled"), steps=3)
    return log_dir


@pytest.fixture(scope="session")
def unmarked_profile(tmp_path_factory) -> Path:
    """Eight steps of the stalled loop numbered without _r=1, as Keras' spans are: XProf finds no steps."""
    log_dir = tmp_path_factory.mktemp("unmarked")
    profiled_loop(log_dir, build_pipeline("stalled"), steps=8, xprof_marks=False)
    return log_dir


def loop_probe(kind, step_ms, wait_ms, compute_ms):
    """A LoopProbe of 10 steps of batches of 32 with these means (ms), as the differential tests build them."""
    from stallscope.analysis.probes import LoopProbe

    share = wait_ms / step_ms
    return LoopProbe(kind=kind, phase="head", steps=10, step_ms=step_ms, input_wait_ms=wait_ms,
                     compute_ms=compute_ms, images_per_second=32000 / step_ms, input_share=share,
                     verdict="highly" if share >= 0.2 else "not")
