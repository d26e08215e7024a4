"""The s3:// readers side by side: obstore against s3fs, in one run, on the storage emulator.

Builds the built-in data set (~75 KB ImageNet-like JPEGs by default) and its TFRecord shards, serves
both from `storage serve --s3` at `--latency`, and reads them with each reader in turn, `--repeats`
times (the fastest pass is shown; CPU is the median):
  files    every JPEG whole, in groups of `--in-flight` requests at once (as a tuned pipeline does):
           requests/s, this process's CPU per GET and the store's (the emulator shares these cores)
  blocks   every training shard in 16 MB blocks, one asked for ahead: MiB/s and CPU per MiB
  records  the same, cut into checked records as the training reader does: MiB/s and CPU per MiB
and prints obstore / s3fs ratios. The store also counts requests, so a HEAD before each GET shows.

  python benchmarks/s3_reader.py [--images-per-class 400 --long-side 400-600 --latency 0 --in-flight 16]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import psutil  # noqa: E402

from stallscope.storage import location, tfdata_readers, s3_request_plan  # noqa: E402
from stallscope.storage.emulator import emulate  # noqa: E402

READERS = ("s3fs", "obstore")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def server_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def make_data(scratch: Path, per_class: int, long_side: str) -> Path:
    def stallscope(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "stallscope", *args], check=True, capture_output=True)

    stallscope("prepare", "synthetic", "--output", str(scratch / "files"), "--classes", "4", "--images-per-class",
               str(per_class), "--long-side", long_side, "--workers", "2")
    stallscope("convert", str(scratch / "files"), "--output-path", str(scratch / "records"), "--train-shards", "4",
               "--validation-shards", "1", "--workers", "2", "--no-progress")
    return scratch


def timed(fn, store_pid: int, store) -> tuple[float, float, float, int]:
    """(seconds, this process's CPU s, the store's CPU s, requests the store saw) of one call."""
    before = (time.perf_counter(), cpu_s(), server_cpu_s(store_pid), store.counters().requests)
    fn()
    return (time.perf_counter() - before[0], cpu_s() - before[1], server_cpu_s(store_pid) - before[2],
            store.counters().requests - before[3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images-per-class", type=int, default=400)
    parser.add_argument("--long-side", default="400-600", help="200-300: ~20 KB JPEGs; 400-600: ~75 KB")
    parser.add_argument("--latency", type=float, default=0.0, help="per-request latency in ms")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if importlib.util.find_spec("obstore") is None:
        raise SystemExit("obstore is not installed: pip install 'stallscope[storage]'")
    with tempfile.TemporaryDirectory(prefix="stallscope-bench-s3-") as scratch_name:
        root = make_data(Path(scratch_name), args.images_per_class, args.long_side)
        jpegs = sorted(p.relative_to(root).as_posix() for p in (root / "files").rglob("*.jpg"))
        shards = sorted(p.relative_to(root).as_posix() for p in (root / "records").glob("train-*.tfrecord"))
        jpeg_mib = sum((root / k).stat().st_size for k in jpegs) / 2**20
        shard_mib = sum((root / k).stat().st_size for k in shards) / 2**20
        print(f"{len(jpegs)} JPEGs ({jpeg_mib * 1024 / len(jpegs):.0f} KB each), {len(shards)} shards "
              f"({shard_mib:.0f} MiB), latency {args.latency:g} ms, {args.in_flight} in flight, "
              f"fastest of {args.repeats} (CPU: median)")
        results: dict[tuple[str, str], tuple[float, float, float]] = {}
        with emulate(root, kind="s3", latency_s=args.latency / 1000.0, max_duration_s=1800) as store:
            os.environ.update(store.env)
            for reader in READERS:
                os.environ[s3_request_plan.READER_ENV] = reader
                location.set_timeout(60)  # a fresh client for this reader
                location.forget_listings()
                paths = [location.as_path(f"{store.url}/{k}") for k in jpegs]
                shard_paths = [location.as_path(f"{store.url}/{k}") for k in shards]

                def files() -> None:
                    for start in range(0, len(paths), args.in_flight):
                        location.read_many(paths[start:start + args.in_flight], args.in_flight)

                def blocks() -> None:
                    for path in shard_paths:
                        for _ in tfdata_readers._blocks(path, location.backend(path)):
                            pass

                def records() -> None:
                    for path in shard_paths:
                        for _ in tfdata_readers._shard_groups(str(path).encode()):
                            pass

                files()  # connections and clients made before timing
                for name, fn, amount in (("files", files, len(jpegs)), ("blocks", blocks, shard_mib),
                                         ("records", records, shard_mib)):
                    runs = [timed(fn, store.pid, store) for _ in range(args.repeats)]
                    seconds = min(r[0] for r in runs)
                    results[reader, name] = (amount / seconds, statistics.median(r[1] for r in runs) * 1000 / amount,
                                             statistics.median(r[2] for r in runs) * 1000 / amount)
                    if name == "files":
                        per_image = statistics.median(r[3] for r in runs) / len(jpegs)
                        results[reader, "requests"] = (per_image, 0.0, 0.0)
    print(f"{'reader':8} {'read':8} {'rate':>15} {'CPU ms':>14} {'store CPU ms':>13}")
    for name, unit in (("files", "GETs/s"), ("blocks", "MiB/s"), ("records", "MiB/s")):
        for reader in READERS:
            rate, cpu, server = results[reader, name]
            per = "per GET" if name == "files" else "per MiB"
            print(f"{reader:8} {name:8} {rate:8,.0f} {unit:6} {cpu:6.2f} {per} {server:6.2f}")
    for reader in READERS:
        print(f"{reader}: {results[reader, 'requests'][0]:.2f} requests per JPEG at the store")
    for name in ("files", "blocks", "records"):
        rate = results["obstore", name][0] / results["s3fs", name][0]
        cpu = results["obstore", name][1] / results["s3fs", name][1]
        print(f"obstore / s3fs, {name}: {rate:.2f}x the rate, {cpu:.2f}x the CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
