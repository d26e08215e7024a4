"""What stallscope's s3:// writes cost, on the storage emulator: the writes `convert` and a Beam
convert make into a bucket, timed at each latency.

  notes    `--notes` small objects written as `location.write_bytes` writes them (under a temporary
           name, then renamed: a PUT, a copy and a delete), one after another, as a lease, a run's
           state and a manifest are
  shards   `--shards` local files of `--shard-mib` MiB uploaded as `location.upload_file` does (a PUT
           under a temporary name, then renamed), one after another
  deletes  the notes deleted, one after another

For each: wall time per operation, this process's CPU per operation and the requests the store
served per operation. Run it once per client to compare them (a checkout before and after a change,
through PYTHONPATH); it uses only the `location` API.

  python benchmarks/s3_writes.py [--latencies 0,10 --notes 50 --shards 8 --shard-mib 8]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from stallscope.storage import location
from stallscope.storage.emulator import emulate


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(store, count: int, operation) -> tuple[float, float, float]:
    """(ms per operation, CPU ms per operation, requests per operation) of `count` calls in turn."""
    requests, cpu, started = store.counters().requests, cpu_s(), time.perf_counter()
    for i in range(count):
        operation(i)
    wall = time.perf_counter() - started
    return 1e3 * wall / count, 1e3 * (cpu_s() - cpu) / count, (store.counters().requests - requests) / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latencies", default="0,10", help="per-request latencies in ms")
    parser.add_argument("--notes", type=int, default=50)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mib", type=int, default=8)
    args = parser.parse_args(argv)
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    print(f"s3:// writes on the emulated store: {args.notes} notes, {args.shards} shards of {args.shard_mib} MiB")
    print(f"{'latency':>8} {'operation':>9} {'ms each':>9} {'CPU ms':>8} {'requests':>9}")
    with tempfile.TemporaryDirectory(prefix="stallscope-bench-s3-writes-") as folder:
        served, local = Path(folder) / "bucket", Path(folder) / "shard.tfrecord"
        served.mkdir()
        local.write_bytes(os.urandom(args.shard_mib << 20))
        for latency in (float(x) for x in args.latencies.split(",")):
            with emulate(served, kind="s3", latency_s=latency / 1e3, writable=True, max_duration_s=600) as store:
                os.environ.update(store.env)
                location.set_timeout(30)
                location.forget_listings()
                root = location.as_path(f"{store.url}/bench-{latency:g}")
                location.write_bytes(root / "first.json", b"{}")  # the client made before the timing
                rows = {
                    "notes": timed(store, args.notes, lambda i: location.write_bytes(root / f"note-{i}.json", b'{"n": 1}')),
                    "shards": timed(store, args.shards, lambda i: location.upload_file(local, root / f"shard-{i}")),
                    "deletes": timed(store, args.notes, lambda i: location.delete(root / f"note-{i}.json")),
                }
                for name, (wall, cpu, requests) in rows.items():
                    print(f"{latency:>6g}ms {name:>9} {wall:>9.2f} {cpu:>8.2f} {requests:>9.2f}")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
