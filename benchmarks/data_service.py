"""Benchmark: a small cluster emulated with CPU quotas, the tf.data service measured against the sizing
model (`stallscope.analysis.service_sizing`) for 1, 2 and 3 workers, and the crossover where shipping
decoded images costs more than decoding them on the trainer.

Each process runs in a fresh cgroup of its own CPU quota (tools/cpu_cgroup.py): the trainer held to
one core, each worker (`stallscope serve worker`) to a fraction of one; the dispatcher (`stallscope
serve dispatcher`, idle but for bookkeeping) has none; loopback network. The pipeline decodes JPEGs of
a stored side (held in memory), resizes them to 224 px float32 and batches 32: 19.3 MB a batch. Two
stored sides: a decode-bound one (large JPEGs) and a light one (small JPEGs), where decoding costs
about what receiving costs. The trainer takes batches as fast as they come (a device faster than both).

The model is fed only with what the trainer alone measured (its CPU per batch, as diagnose's probes
measure it) and the per-MB costs in service_sizing (measured once with a local service, not fitted to
these cells). Printed per stored side and worker count: measured images/s, the model's, their ratio,
what limits the model, and each cell's ratio to the trainer alone measured in the same run.

It takes root and a cgroup CPU controller; where there is none it says so and exits 0.

  python benchmarks/data_service.py [--worker-cores 0.3 --batches 12 --sides 512,96]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tools"))

BATCH = 32
IMAGE = 224
IMAGES = 48          # distinct JPEGs, cycled
WARMUP = 3           # batches before the clock starts
START_S = 120.0      # a process's TF import on a loaded machine


def pipeline(side: int):
    """Decode-bound input: JPEGs of `side` px (made here, in memory) -> decode -> 224 px float32 -> batch."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(side)
    coarse = rng.uniform(0, 255, size=(IMAGES, 12, 12, 3)).astype("float32")
    images = tf.cast(tf.image.resize(coarse, [side, side], method="bicubic"), tf.uint8)
    noise = tf.cast(rng.integers(0, 24, size=(IMAGES, side, side, 3)), tf.uint8)
    encoded = [tf.io.encode_jpeg(tf.clip_by_value(img + n, 0, 255), quality=90) for img, n in zip(images, noise)]

    def decode(data):
        image = tf.io.decode_jpeg(data, channels=3)
        return tf.image.resize(image, [IMAGE, IMAGE]) / 127.5 - 1.0

    dataset = tf.data.Dataset.from_tensor_slices(encoded).repeat().map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(BATCH, drop_remainder=True)


def measure(side: int, batches: int, service: str | None) -> dict:
    """In this (quota-held) process: images/s and CPU per batch of the pipeline, here or from the service."""
    import tensorflow as tf

    dataset = pipeline(side)
    if service:
        from stallscope.service.servers import DistributeOptions, distribute

        dataset = distribute(dataset, service, DistributeOptions(processing_mode="parallel_epochs",
                                                                 job_name=f"bench-{os.getpid()}"))
    iterator = iter(dataset.prefetch(2))
    for _ in range(WARMUP):
        batch = next(iterator)
    cpu, started = time.process_time(), time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"images_per_second": batches * BATCH / seconds, "cpu_ms_per_batch": cpu * 1000 / batches,
            "bytes_per_batch": int(batch.numpy().nbytes)}


def in_cgroup(cores: float | None, command: list[str], **popen) -> tuple[subprocess.Popen, object]:
    """`command` started in a fresh cgroup of `cores` CPUs' quota (None: no quota)."""
    from cpu_cgroup import CpuCgroup, writable_parent

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if cores is None:
        return subprocess.Popen(command, env=env, **popen), None
    group = CpuCgroup(*writable_parent())
    group.limit(cores)
    return subprocess.Popen(command, env=env, preexec_fn=lambda: group.procs.write_text(str(os.getpid())),
                            **popen), group


def trainer(side: int, batches: int, service: str | None) -> dict:
    """One measurement in a fresh process held to one core."""
    command = [sys.executable, __file__, "--measure", str(side), "--batches", str(batches)]
    process, group = in_cgroup(1.0, command + (["--service", service] if service else []),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=600)
    finally:
        group.remove()
    if process.returncode != 0:
        raise SystemExit(f"data_service: a trainer run failed: {err.strip().splitlines()[-1:]}")
    return json.loads(out.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def with_service(side: int, batches: int, workers: int, worker_cores: float) -> dict:
    """A dispatcher, `workers` workers each held to `worker_cores`, and the trainer held to one core."""
    port = free_port()
    cli = [sys.executable, "-m", "stallscope", "serve"]
    started: list[tuple[subprocess.Popen, object]] = []
    try:
        started.append(in_cgroup(None, cli + ["dispatcher", "--port", str(port)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL))
        for _ in range(workers):
            started.append(in_cgroup(worker_cores, cli + ["worker", "--dispatcher", f"127.0.0.1:{port}",
                                                          "--dispatcher-timeout", f"{START_S:g}s"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        deadline = time.monotonic() + START_S
        for process, _ in started[1:]:  # each worker says it registered
            line = ""
            while "registered" not in line and time.monotonic() < deadline and process.poll() is None:
                line = process.stdout.readline()
            if "registered" not in line:
                raise SystemExit("data_service: a worker did not register")
        return trainer(side, batches, f"127.0.0.1:{port}")
    finally:
        for process, _ in reversed(started):
            process.terminate()
        for process, group in started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if group is not None:
                group.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-cores", type=float, default=0.3)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--sides", default="512,96", help="stored JPEG sides, comma-separated")
    parser.add_argument("--max-workers", type=int, default=3)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--service", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.batches, args.service)), flush=True)
        return
    from cpu_cgroup import writable_parent

    if writable_parent() is None:
        print("data_service: no cgroup CPU controller this process may use (needs root): nothing measured")
        return
    from stallscope.analysis import service_sizing as sizing

    print(f"trainer held to 1 core, each worker to {args.worker_cores:g} core, loopback; batches of {BATCH} x "
          f"{IMAGE} px float32 ({BATCH * sizing.decoded_image_bytes(IMAGE) / 1e6:.1f} MB)")
    print(f"{'stored':>7} {'workers':>8} {'measured':>10} {'model':>8} {'meas/model':>11} {'bound':>8} "
          f"{'vs alone':>9}")
    errors = []
    for side in (int(s) for s in args.sides.split(",")):
        alone = trainer(side, args.batches, None)
        rate = alone["images_per_second"]
        inputs = sizing.ServiceInputs(
            cpu_ms_per_element=alone["cpu_ms_per_batch"], bytes_per_element=float(alone["bytes_per_batch"]),
            device_elements_per_second=1e9, worker_cores=args.worker_cores, trainer_cores=1.0, link_gbps=100.0,
            images_per_element=BATCH, local_elements_per_second=rate / BATCH)
        print(f"{side:>5}px {'alone':>8} {rate:>10,.0f} {'':>8} {'':>11} {'':>8} {1.0:>8.2f}x   "
              f"(CPU {alone['cpu_ms_per_batch'] / BATCH:.2f} ms per image decoded here; receiving costs "
              f"{sizing.receive_ms_per_element(inputs) / BATCH:.2f} ms per image)")
        for workers in range(1, args.max_workers + 1):
            got = with_service(side, args.batches, workers, args.worker_cores)["images_per_second"]
            row = sizing.predict(inputs, workers)
            errors.append(got / row.images_per_second - 1)
            print(f"{side:>5}px {workers:>8} {got:>10,.0f} {row.images_per_second:>8,.0f} "
                  f"{got / row.images_per_second:>10.2f}x {row.bound:>8} {got / rate:>8.2f}x", flush=True)
        plan = sizing.size_service(inputs)
        print(f"        crossover: with enough workers the service gives {plan.ceiling.images_per_second:,.0f} "
              f"images/s ({plan.ceiling.bound}-bound) against {rate:,.0f} decoding here: "
              + ("the service pays off" if plan.pays_off else "shipping decoded images costs more than decoding here"))
    print(f"model error: largest {max(abs(e) for e in errors):.0%} over {len(errors)} cells (target: within 25%)")


if __name__ == "__main__":
    main()
