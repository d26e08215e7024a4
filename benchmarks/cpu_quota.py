"""Benchmark: a tf.data pipeline of your own under a CPU quota below its CPUs (a container's `--cpus`,
a pod's CPU limit), on TF's shared pool against the private pool of the quota's whole cores that
`diagnose` advises (and `tuned` takes), in one run.

TF sizes tf.data's shared pool by the CPUs the process may run on, not by its quota. The pipeline
is what a user writes: JPEG bytes (read once, cached), `decode_jpeg` + resize to 160 px in a
parallel map (AUTOTUNE), batches of 32, prefetch; the step is an emulated device of 2,000 images/s
(16 ms per batch). Each variant runs in a fresh process inside a fresh cgroup of the quota
(tools/cpu_cgroup.py), the variants alternating over the repeats; printed per quota: images/s, step
time at the 50th and 90th percentile and its standard deviation, the share of quota periods that ran
out and the seconds held back over the measured steps, and the ratios of the quota's pool to TF's.

It takes root and a cgroup CPU controller, and at least 2 CPUs; where these are missing it says so
and exits 0 (nothing to measure here).

  python benchmarks/cpu_quota.py [--quotas 1,0.5 --steps 200 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tools"))

BATCH = 32
IMAGE = 160
DEVICE_MS = 16.0  # an emulated device of 2,000 images/s
WARMUP = 20


def measure(root: str, pool: int, steps: int) -> dict:
    """Step times of the pipeline in this (fresh, quota-limited) process; pool 0 is TF's shared pool."""
    import time

    import tensorflow as tf

    from stallscope.cpu_limits import current, throttling

    files = sorted(str(p) for p in Path(root).rglob("*.jpg"))
    encoded = [Path(f).read_bytes() for f in files]

    def decode(data):
        image = tf.io.decode_jpeg(data, channels=3)
        return tf.image.resize(image, [IMAGE, IMAGE])

    dataset = tf.data.Dataset.from_tensor_slices(encoded).repeat().map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(BATCH).prefetch(tf.data.AUTOTUNE)
    if pool:
        options = tf.data.Options()
        options.threading.private_threadpool_size = pool
        dataset = dataset.with_options(options)
    limits = current()
    iterator = iter(dataset)
    step_ms = []
    for step in range(WARMUP + steps):
        if step == WARMUP:
            before = throttling(limits)  # the quota's counters over the measured steps only
        started = time.perf_counter()
        next(iterator)
        time.sleep(DEVICE_MS / 1000.0)  # the device's step, while the pipeline prepares the next batch
        if step >= WARMUP:
            step_ms.append((time.perf_counter() - started) * 1000.0)
    held = throttling(limits).since(before)
    ordered = sorted(step_ms)
    return {"images_per_second": BATCH * len(step_ms) / (sum(step_ms) / 1000.0),
            "p50_ms": ordered[len(ordered) // 2], "p90_ms": ordered[math.ceil(0.9 * len(ordered)) - 1],
            "std_ms": statistics.pstdev(step_ms), "throttled_share": held.throttled_share, "held_s": held.throttled_s}


def run_variant(root: Path, quota: float, pool: int, steps: int) -> dict:
    """One run in a fresh process inside a fresh cgroup of `quota` CPUs."""
    from cpu_cgroup import CpuCgroup, writable_parent

    group = CpuCgroup(*writable_parent())
    try:
        group.limit(quota)
        done = subprocess.run(
            [sys.executable, __file__, "--measure", str(root), "--pool", str(pool), "--steps", str(steps)],
            capture_output=True, text=True, timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            preexec_fn=lambda: group.procs.write_text(str(os.getpid())))
    finally:
        group.remove()
    if done.returncode != 0:
        raise SystemExit(f"cpu_quota: a run failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def spans(results: list[dict], key: str, fmt: str) -> str:
    values = sorted(r[key] for r in results)
    low, high = format(values[0], fmt), format(values[-1], fmt)
    return low if low == high else f"{low}-{high}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quotas", default="1,0.5", help="CPU quotas to run under, comma-separated")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--pool", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.pool, args.steps)))
        return

    from cpu_cgroup import writable_parent

    from stallscope.cpu_limits import CpuLimits, current
    from stallscope.data.synthetic import SyntheticOptions, make_synthetic

    cpus = current().cpus
    if writable_parent() is None or len(cpus) < 2:
        print("cpu_quota: nothing to measure here: it takes root, a cgroup CPU controller and 2 CPUs or more")
        return
    quotas = [float(q) for q in args.quotas.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        make_synthetic(root, SyntheticOptions(classes=4, images_per_class=args.images // 4, validation_fraction=0.0))
        print(f"{args.images} photo-like JPEGs, decode + resize to {IMAGE} px, batches of {BATCH}, "
              f"an emulated device of {1000 * BATCH / DEVICE_MS:,.0f} images/s, {args.steps} steps, "
              f"{len(cpus)} CPUs; medians and spans of {args.repeats} runs")
        for quota in quotas:
            threads = CpuLimits(cpus=cpus, quota_cores=quota).whole_cores
            pools = {f"TF's pool ({len(cpus)} threads)": 0, f"the quota's pool ({threads})": threads}
            results: dict[str, list[dict]] = {name: [] for name in pools}
            for _ in range(args.repeats):
                for name, pool in pools.items():
                    results[name].append(run_variant(root, quota, pool, args.steps))
            print(f"\nquota {quota:g} CPUs")
            print(f"  {'pool':<26}{'images/s':>14}{'step p50':>14}{'step p90':>14}{'step std':>14}"
                  f"{'ran out':>10}{'held back':>12}")
            for name, runs in results.items():
                print(f"  {name:<26}{spans(runs, 'images_per_second', ',.0f'):>14}{spans(runs, 'p50_ms', '.1f'):>14}"
                      f"{spans(runs, 'p90_ms', '.1f'):>14}{spans(runs, 'std_ms', '.1f'):>14}"
                      f"{spans(runs, 'throttled_share', '.0%'):>10}{spans(runs, 'held_s', '.2f'):>12}")
            shared, own = (results[name] for name in pools)

            def ratio(key: str) -> float:
                return statistics.median(r[key] for r in own) / statistics.median(r[key] for r in shared)

            held = [statistics.median(r["held_s"] for r in runs) for runs in (own, shared)]
            print(f"  the quota's pool / TF's pool: images/s {ratio('images_per_second'):.2f}x, step p90 "
                  f"{ratio('p90_ms'):.2f}x, step std {ratio('std_ms'):.2f}x; held back {held[0]:.2f} s against "
                  f"{held[1]:.2f} s")


if __name__ == "__main__":
    main()
