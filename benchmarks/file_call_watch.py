"""What the watch on TF's own file calls costs a training process (`stallscope train` on a network file
system, `stallscope.watch_storage()`).

Builds a tf.data pipeline that keeps many threads busy (a parallel map over files read with
tf.io.read_file, as the files source does), then prints:
  - one look at every thread (/proc/self/task/*/syscall), in ms, and its share of the default 1 s
    between looks;
  - the pipeline's elements/s with the watch looking every `--amplified-interval` (100 times the
    default rate) against the same pipeline without it, in the same run, repeat by repeat.

  python benchmarks/file_call_watch.py [--files 20000 --parallel 16 --repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--parallel", type=int, default=16, help="the map's parallel calls (threads)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--amplified-interval", type=float, default=0.01, metavar="S")
    args = parser.parse_args()

    import tensorflow as tf

    from stallscope.storage.stuck_calls import StuckCallWatch

    if not StuckCallWatch.available():
        raise SystemExit("the watch needs Linux (x86-64 or arm64) and /proc/self/task/*/syscall")
    with tempfile.TemporaryDirectory() as work:
        paths = []
        for index in range(args.files):
            path = Path(work) / f"{index:06d}.bin"
            path.write_bytes(os.urandom(16 << 10))
            paths.append(str(path))
        dataset = (tf.data.Dataset.from_tensor_slices(paths)
                   .map(lambda p: tf.strings.length(tf.io.read_file(p)), num_parallel_calls=args.parallel)
                   .prefetch(8))

        def elements_per_s() -> float:
            started = time.perf_counter()
            count = sum(1 for _ in dataset)
            return count / (time.perf_counter() - started)

        elements_per_s()  # warm: the files in the page cache, the pipeline's threads made
        watch = StuckCallWatch(30.0, lambda stuck: None)
        threads = len(os.listdir("/proc/self/task"))
        looks = 200
        started = time.perf_counter()
        for _ in range(looks):
            watch.sample()
        look_ms = (time.perf_counter() - started) * 1e3 / looks
        print(f"threads in the process: {threads}")
        print(f"one look: {look_ms:.3f} ms; at the default 1 s between looks: {look_ms / 1e3:.4%} of one core")

        ratios = []
        for _ in range(args.repeats):
            without = elements_per_s()
            with StuckCallWatch(30.0, lambda stuck: None, interval_s=args.amplified_interval):
                watched = elements_per_s()
            ratios.append(watched / without)
            print(f"  without {without:,.0f} elements/s, watched every {args.amplified_interval:g} s {watched:,.0f}: "
                  f"{watched / without:.3f}x")
        print(f"watched every {args.amplified_interval:g} s (100x the default rate) against unwatched: "
              f"median {statistics.median(ratios):.3f}x (by repeat {min(ratios):.3f}x-{max(ratios):.3f}x)")


if __name__ == "__main__":
    main()
