"""Benchmark: how long `analyze` takes on a 100-step profile, and how much profiling slows steps.

Both figures are measured in this run against baselines from the same run:
- analysis time of a 100-step profile (target < 2 s), with and without xprof's cross-check;
- profiling overhead: the same pipeline and emulated device step, steps timed with the profiler on
  vs off (target < 5% slower), alternating rounds so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

DEVICE_S = 0.010


def build_dataset():
    import tensorflow as tf

    def decode(x):
        image = tf.random.stateless_uniform([64, 64, 3], seed=tf.stack([x, x]), maxval=255, dtype=tf.int32)
        jpeg = tf.io.encode_jpeg(tf.cast(image, tf.uint8))
        return tf.image.resize(tf.io.decode_jpeg(jpeg), [56, 56])

    return tf.data.Dataset.range(10**7).map(decode, num_parallel_calls=2).batch(8).prefetch(2)


def run_steps(steps: int, log_dir: Path | None) -> float:
    """Mean ms per step of `steps` steps (get_next + device sleep), profiled into log_dir when given."""
    import tensorflow as tf

    iterator = iter(build_dataset())
    for _ in range(3):
        next(iterator)
    if log_dir is not None:
        tf.profiler.experimental.start(str(log_dir))
    start = time.perf_counter()
    for step in range(steps):
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
            next(iterator)
            time.sleep(DEVICE_S)
    elapsed = time.perf_counter() - start
    if log_dir is not None:
        tf.profiler.experimental.stop()
    return elapsed / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from stallscope.analysis.analyze import analyze_run
    from stallscope.tfimport import import_tensorflow

    import_tensorflow()
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "profile100"
        run_steps(args.steps, log_dir)
        timings = {}
        for label, with_xprof in (("analysis only", False), ("analysis + xprof cross-check", True)):
            analyze_run(log_dir, with_xprof=with_xprof)  # warm imports
            start = time.perf_counter()
            analysis = analyze_run(log_dir, with_xprof=with_xprof)
            timings[label] = time.perf_counter() - start
        print(f"analysing a {analysis.steps.counted_steps + 2}-step profile "
              f"({Path(analysis.profile_path).stat().st_size / 1e6:.1f} MB):")
        for label, seconds in timings.items():
            print(f"  {label:<30} {seconds:6.2f} s   {seconds / 2.0:5.2f}x of the 2 s target")

        plain, profiled = [], []
        for index in range(args.rounds):
            plain.append(run_steps(args.steps, None))
            profiled.append(run_steps(args.steps, Path(tmp) / f"overhead{index}"))
        base, with_profiler = statistics.median(plain), statistics.median(profiled)
        print(f"profiling overhead ({args.steps} steps x {args.rounds} rounds, median of rounds):")
        print(f"  without profiler  {base:7.2f} ms/step   {8 / base * 1e3:7.1f} images/s   1.00x")
        print(f"  with profiler     {with_profiler:7.2f} ms/step   {8 / with_profiler * 1e3:7.1f} images/s   "
              f"{with_profiler / base:.3f}x step time ({(with_profiler / base - 1) * 100:+.1f}%, target < +5%)")


if __name__ == "__main__":
    main()
