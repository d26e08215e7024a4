"""Benchmark: a small cluster emulated with CPU quotas, the tf.data service measured against the sizing
model (`stallscope.analysis.service_sizing`) for 1, 2 and 3 workers, and the crossover where shipping
decoded images costs more than decoding them on the trainer.

Each process runs in a fresh cgroup of its own CPU quota (tools/cpu_cgroup.py): the trainer held to
one core, each worker (`stallscope serve worker`) to a fraction of one; the dispatcher (`stallscope
serve dispatcher`, idle but for bookkeeping) has none; loopback network. The cluster is sized to fit
this machine: the trainer's core and every worker's quota, with a reserve (RESERVE_CORES) for the
dispatcher and the kernel's loopback networking, which no quota holds, within the cores this process
may use; the workers' quota is chosen so that every cell fits, unless --worker-cores says another. A
cell whose quotas ask for more than the machine has is measured, labelled "over" and not held to the
target: its workers cannot all get their quota. The pipeline decodes JPEGs of
a stored side (held in memory), resizes them to 224 px float32 and batches 32: 19.3 MB a batch. Two
stored sides: a decode-bound one (large JPEGs) and a light one (small JPEGs), where decoding costs
about what receiving costs. The trainer takes batches as fast as they come (a device faster than both).

The model is fed only with what the trainer alone measured (its CPU per batch, as diagnose's probes
measure it), the per-MB costs in service_sizing (measured once with a local service, not fitted to
these cells), the quotas and this host's cores less the reserve (the workers share the trainer's host:
service_sizing's "host" bound). Printed per stored side and worker count: measured images/s, the
model's, their ratio, what limits the model, each cell's ratio to the trainer alone measured in the
same run, and over the measured seconds: the trainer's CPU, the CPU the workers got as a share of
their quotas, and the machine's CPU outside the quotas (dispatcher, kernel, any other process); a cell
where that is well above the reserve is labelled "loaded" (another process took cores the quotas assume).

It takes root and a cgroup CPU controller; where there is none it says so and exits 0.

  python benchmarks/data_service.py [--worker-cores C --seconds 4 --sides 512,96 --max-workers 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
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
WARMUP = 3           # batches before the clock starts, and at least WARMUP_S (every worker's first elements)
WARMUP_S = 2.0
START_S = 120.0      # a process's TF import on a loaded machine
TRAINER_CORES = 1.0  # the trainer's quota, alone and with the service
RESERVE_CORES = 0.25  # left to the dispatcher (no quota) and the kernel's loopback networking (no quota holds it)
LOADED_MARGIN = 0.15  # a cell with more than the reserve and this busy outside the quotas is labelled "loaded"


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


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user and system, all threads) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds this machine's cores have been busy (all processes and the kernel) since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def measure(side: int, batches: int, seconds: float, service: str | None, watched: list[int]) -> dict:
    """In this (quota-held) process: images/s and CPU per batch of the pipeline, here or from the service,
    over at least `batches` batches and `seconds` after the warm-up; the CPU of the `watched` processes
    (the workers) and of the whole machine over the same seconds."""

    dataset = pipeline(side)
    if service:
        from stallscope.service.servers import DistributeOptions, distribute

        dataset = distribute(dataset, service, DistributeOptions(processing_mode="parallel_epochs",
                                                                 job_name=f"bench-{os.getpid()}"))
    iterator = iter(dataset.prefetch(2))
    batch = next(iterator)
    first, count = time.perf_counter(), 1
    while count < WARMUP or time.perf_counter() - first < WARMUP_S:
        batch, count = next(iterator), count + 1
    others = [process_cpu_s(pid) for pid in watched]
    busy, cpu, started = machine_busy_s(), time.process_time(), time.perf_counter()
    count = 0
    while count < batches or time.perf_counter() - started < seconds:
        batch, count = next(iterator), count + 1
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    others = [process_cpu_s(pid) - before for pid, before in zip(watched, others)]
    return {"images_per_second": count * BATCH / wall, "cpu_ms_per_batch": cpu * 1000 / count,
            "bytes_per_batch": int(batch.numpy().nbytes), "seconds": wall, "trainer_cores": cpu / wall,
            "watched_cores": [c / wall for c in others], "machine_cores": (machine_busy_s() - busy) / wall}


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


def trainer(side: int, batches: int, seconds: float, service: str | None, watched: list[int] = ()) -> dict:
    """One measurement in a fresh process held to TRAINER_CORES."""
    command = [sys.executable, __file__, "--measure", str(side), "--batches", str(batches), "--seconds", str(seconds)]
    command += ["--service", service] if service else []
    command += ["--watch", ",".join(str(pid) for pid in watched)] if watched else []
    process, group = in_cgroup(TRAINER_CORES, command,
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


def with_service(side: int, batches: int, seconds: float, workers: int, worker_cores: float) -> dict:
    """A dispatcher, `workers` workers each held to `worker_cores`, and the trainer held to TRAINER_CORES."""
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
        return trainer(side, batches, seconds, f"127.0.0.1:{port}", [process.pid for process, _ in started[1:]])
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


def fitted_worker_cores(cores: float, workers: int) -> float:
    """The workers' quota that fits `workers` of them beside the trainer and the reserve, in 0.05 core steps."""
    return math.floor((cores - RESERVE_CORES - TRAINER_CORES) / workers * 20 + 1e-9) / 20


def asks(workers: int, worker_cores: float) -> float:
    """The cores a cell's quotas and the reserve ask for."""
    return TRAINER_CORES + workers * worker_cores + RESERVE_CORES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-cores", type=float, help="each worker's quota (default: the most that fits "
                                                           "--max-workers of them on this machine)")
    parser.add_argument("--batches", type=int, default=12, help="at least this many batches measured")
    parser.add_argument("--seconds", type=float, default=4.0, help="at least this long measured")
    parser.add_argument("--sides", default="512,96", help="stored JPEG sides, comma-separated")
    parser.add_argument("--max-workers", type=int, default=3)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--service", help=argparse.SUPPRESS)
    parser.add_argument("--watch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        watched = [int(pid) for pid in args.watch.split(",")] if args.watch else []
        print(json.dumps(measure(args.measure, args.batches, args.seconds, args.service, watched)), flush=True)
        return
    from cpu_cgroup import writable_parent

    if writable_parent() is None:
        print("data_service: no cgroup CPU controller this process may use (needs root): nothing measured")
        return
    from stallscope.analysis import service_sizing as sizing
    from stallscope.cpu_limits import current

    cores = current().capacity
    worker_cores = args.worker_cores or fitted_worker_cores(cores, args.max_workers)
    if not worker_cores > 0:
        print(f"data_service: {cores:g} cores hold the trainer's {TRAINER_CORES:g} and the {RESERVE_CORES:g} "
              f"reserve but leave nothing for {args.max_workers} workers: nothing measured (--worker-cores to force)")
        return
    host = cores - RESERVE_CORES
    most = asks(args.max_workers, worker_cores)
    print(f"machine: {cores:g} cores, load average {os.getloadavg()[0]:.2f} at the start; reserve {RESERVE_CORES:g} "
          f"core for the dispatcher and the kernel's loopback networking (no quota holds them)")
    print(f"trainer held to {TRAINER_CORES:g} core, each worker to {worker_cores:g} core, loopback: {args.max_workers} "
          f"workers ask {most:g} of {cores:g} cores with the reserve: "
          + ("every cell fits" if most <= cores + 1e-9 else "cells marked 'over' do not fit"))
    print(f"batches of {BATCH} x {IMAGE} px float32 ({BATCH * sizing.decoded_image_bytes(IMAGE) / 1e6:.1f} MB); "
          f"each cell measured over at least {args.seconds:g} s and {args.batches} batches after a warm-up")
    print(f"{'stored':>7} {'workers':>8} {'measured':>10} {'model':>8} {'meas/model':>11} {'bound':>8} "
          f"{'vs alone':>9} {'trainer':>8} {'workers got':>12} {'outside':>8}")
    errors, over = [], []
    for side in (int(s) for s in args.sides.split(",")):
        alone = trainer(side, args.batches, args.seconds, None)
        rate = alone["images_per_second"]
        inputs = sizing.ServiceInputs(
            cpu_ms_per_element=alone["cpu_ms_per_batch"], bytes_per_element=float(alone["bytes_per_batch"]),
            device_elements_per_second=1e9, worker_cores=worker_cores, trainer_cores=TRAINER_CORES,
            link_gbps=100.0, images_per_element=BATCH, local_elements_per_second=rate / BATCH, host_cores=host)
        print(f"{side:>5}px {'alone':>8} {rate:>10,.0f} {'':>8} {'':>11} {'':>8} {1.0:>8.2f}x "
              f"{alone['trainer_cores']:>8.2f} {'':>12} {outside(alone):>8.2f}   (CPU "
              f"{alone['cpu_ms_per_batch'] / BATCH:.2f} ms per image decoded here; receiving costs "
              f"{sizing.receive_ms_per_element(inputs) / BATCH:.2f} ms per image){loaded(alone)}", flush=True)
        for workers in range(1, args.max_workers + 1):
            got = with_service(side, args.batches, args.seconds, workers, worker_cores)
            row = sizing.predict(inputs, workers)
            ratio = got["images_per_second"] / row.images_per_second
            fits = asks(workers, worker_cores) <= cores + 1e-9
            (errors if fits else over).append(ratio - 1)
            share = sum(got["watched_cores"]) / (workers * worker_cores)
            label = "" if fits else f"   over: asks {asks(workers, worker_cores):g} of {cores:g} cores"
            label += loaded(got)
            print(f"{side:>5}px {workers:>8} {got['images_per_second']:>10,.0f} {row.images_per_second:>8,.0f} "
                  f"{ratio:>10.2f}x {row.bound:>8} {got['images_per_second'] / rate:>8.2f}x "
                  f"{got['trainer_cores']:>8.2f} {share:>11.0%} {outside(got):>8.2f}{label}", flush=True)
        here = sizing.size_service(inputs).ceiling
        apart = sizing.size_service(dataclasses.replace(inputs, host_cores=None))
        print(f"        crossover, against {rate:,.0f} images/s decoding here: on this host ({host:g} cores shared) "
              f"the service gives at most {here.images_per_second:,.0f} ({here.bound}-bound, {here.workers} workers), "
              f"{pays(here.images_per_second > rate)}; with workers on hosts of their own "
              f"{apart.ceiling.images_per_second:,.0f} ({apart.ceiling.bound}-bound), {pays(apart.pays_off)}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    print(f"model error: largest {max(abs(e) for e in errors):.0%} over {len(errors)} cells that fit (target: within "
          f"25%)" if errors else "model error: no cell fits this machine")
    if over:
        print(f"{len(over)} cells over the machine's cores, not held to the target: largest error "
              f"{max(abs(e) for e in over):.0%}")


def pays(off: bool) -> str:
    return "it pays off" if off else "shipping decoded images costs more than decoding here"


def loaded(result: dict) -> str:
    """A label where the machine was busy outside the quotas well beyond the reserve (another process)."""
    busy = outside(result)
    return f"   loaded: {busy:.2f} cores busy outside the quotas (reserve {RESERVE_CORES:g})" \
        if busy > RESERVE_CORES + LOADED_MARGIN else ""


def outside(result: dict) -> float:
    """The machine's cores busy outside the trainer's and the workers' quotas over the measured seconds."""
    return result["machine_cores"] - result["trainer_cores"] - sum(result["watched_cores"])


if __name__ == "__main__":
    main()
