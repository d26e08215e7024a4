"""Benchmark: the storage what-if's model of reads in flight, against real pipelines in one run.

Every read of a JPEG is held for a latency L inside the read stage (a blocking call on the tf.data
thread that runs it, as a remote GET is), for L in 0, 3, 10, 30 ms, and the pipeline alone is timed
reading one at a time, with 16 parallel reads on tf.data's shared pool, and with 16 parallel reads
on a private pool of 32 threads. The model (`analysis/storage_whatif.py`) predicts each from the CPU
per image measured here with no latency; the table prints measured, predicted and their ratio
(target: within 25%). The object-store client's own costs (TLS, TF's block buffer) are calibrated
separately against `stallscope storage serve`; here the request overhead is the held time alone.

usage: python benchmarks/storage.py [--images 96] [--latencies 0,3,10,30]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

def held_reads(latency_s: float, parallel_calls: int | None):
    """An after_read hook: each element waits latency_s on the thread that reads it."""
    import tensorflow as tf

    def hold(data):
        time.sleep(latency_s)
        return data

    def hook(dataset):
        def wait(data, *rest):
            data = tf.numpy_function(hold, [data], tf.string, stateful=True)
            return (data, *rest)

        return dataset.map(wait, num_parallel_calls=parallel_calls, deterministic=None if parallel_calls is None else False, name="held_read")

    return hook


def run(config, source, *, latency_ms: float, parallel_calls: int | None, images: int):
    from stallscope.analysis.probes import probe_pipeline

    hooks = {"after_read": held_reads(latency_ms / 1000.0, parallel_calls)}
    return probe_pipeline(config, source, cache_state="warm", max_images=images, budget_s=60.0, extra_stages=hooks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--latencies", default="0,3,10,30")
    args = parser.parse_args()
    from stallscope.analysis import storage_whatif as sw
    from stallscope.cli.main import main as cli
    from stallscope.pipeline.config import PipelineConfig
    from stallscope.pipeline.sources import open_source

    latencies = [float(x) for x in args.latencies.split(",")]
    with tempfile.TemporaryDirectory(prefix="stallscope-bench-storage-") as scratch:
        data = Path(scratch) / "data"
        if cli(["prepare", "synthetic", "--output", str(data), "--classes", "4",
                "--images-per-class", str(max(2, math.ceil(args.images / 4 / 0.8)))]) != 0:
            raise SystemExit("prepare failed")
        source = open_source("files", data / "train")
        base = PipelineConfig(batch_size=8, image_size=128, shuffle_buffer=0, map_parallelism=None,
                              map_parallelization=False, inject_prefetch=False, map_and_batch_fusion=False)
        cells = {
            "sequential": (base, None),
            "16 reads, shared pool": (base.replace(map_parallelism=-1), 16),
            "16 reads, private pool of 32": (base.replace(map_parallelism=-1, private_threadpool_size=32), 16),
        }
        local = run(base, source, latency_ms=0.0, parallel_calls=None, images=args.images)
        cores = max(1.0, local.cores - local.other_cores_busy)
        pattern = sw.IoPattern("files", source.total_bytes / source.num_examples, 1.0)
        held = sw.StorageClient(name="held", block_bytes=1 << 40, requests_per_open=0, request_overhead_ms=0.0,
                                request_cpu_ms=0.0, transfer_cpu_ms_per_mib=0.0, new_connection_per_request=False,
                                description="a read held for the latency, nothing else")
        print(f"{source.num_examples} JPEGs, {local.cpu_ms_per_image:.2f} ms CPU per image, {cores:.1f} cores free; "
              "images/s measured / predicted (ratio)")
        print(f"{'latency':>8}  " + "  ".join(f"{name:>30}" for name in cells))
        worst = 0.0
        for latency in latencies:
            row = []
            c = sw.costs(pattern, sw.StorageScenario("x", latency, math.inf), held,
                         cpu_ms_per_image=local.cpu_ms_per_image)
            for config, calls in cells.values():
                measured = run(config, source, latency_ms=latency, parallel_calls=calls, images=args.images)
                if calls is None:
                    predicted = sw.sequential_rate(c)
                else:
                    reads = sw.Reads(parallel_calls=calls, pool_threads=config.private_threadpool_size or local.cores,
                                     reads_in_decode_map=False, private_pool=bool(config.private_threadpool_size))
                    predicted = sw.parallel_rate(c, sw.requests_in_flight(reads, c), cores)[0]
                ratio = measured.images_per_second / predicted
                worst = max(worst, abs(ratio - 1))
                row.append(f"{measured.images_per_second:>8,.0f} / {predicted:>8,.0f} ({ratio:4.2f})")
            print(f"{latency:>6g}ms  " + "  ".join(f"{cell:>30}" for cell in row))
        print(f"largest deviation: {worst * 100:.0f}% (target: within 25%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
