"""Benchmark: how many calls at once does the emulated mount serve?

A FUSE mount is served by libfuse's worker threads, and the kernel keeps a limited number of
read-ahead requests in flight to it. The emulator asks for MOUNT_THREADS of each; libfuse's defaults
are 10 threads and 12 background requests. This serves a folder of 128 KiB files as a mount at a
latency, reads N files at once (each an open and a read, each paying the latency), and prints calls/s
with the emulator's settings against libfuse's defaults measured in the same run, and the ideal
(N files take two latencies when every call is served at once).

usage: python benchmarks/mount_concurrency.py [--files 64] [--latency-ms 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stallscope.storage.emulator import fuse_mount  # noqa: E402
from stallscope.storage.emulator.serving import RunningStore, StoreOptions  # noqa: E402

FILE_BYTES = 128 * 1024
LIBFUSE_DEFAULT_THREADS = 10


def read_at_once(files: list[Path]) -> float:
    """Seconds to read every file, one thread per file, after evicting their cached pages."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    def read(path: Path) -> None:
        with open(path, "rb", buffering=0) as handle:
            while handle.read(1 << 16):
                pass

    threads = [threading.Thread(target=read, args=(path,)) for path in files]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def calls_per_second(root: Path, files: int, latency_s: float, threads: int, repeats: int) -> float:
    fuse_mount.MOUNT_THREADS = threads
    with tempfile.TemporaryDirectory(prefix="bench-mnt-") as mount, \
            tempfile.TemporaryDirectory(prefix="bench-state-") as state:
        store = RunningStore(StoreOptions(root=root, kind="mount", latency_s=latency_s, mount_point=Path(mount)),
                             Path(state)).start()
        try:
            paths = sorted(Path(mount).glob("*.bin"))[:files]
            rates = []
            for _ in range(repeats):
                before = store.counters.snapshot().requests
                seconds = read_at_once(paths)
                rates.append((store.counters.snapshot().requests - before) / seconds)
            return statistics.median(rates)
        finally:
            store.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    why = fuse_mount.why_no_fuse()
    if why:
        print(f"skipped: {why}")
        return 0
    chosen = fuse_mount.MOUNT_THREADS
    with tempfile.TemporaryDirectory(prefix="bench-data-") as folder:
        root = Path(folder)
        for index in range(args.files):
            (root / f"{index:04d}.bin").write_bytes(os.urandom(FILE_BYTES))
        latency = args.latency_ms / 1000
        baseline = calls_per_second(root, args.files, latency, LIBFUSE_DEFAULT_THREADS, args.repeats)
        emulator = calls_per_second(root, args.files, latency, chosen, args.repeats)
    ideal = 2 * args.files / (2 * latency)
    print(f"{args.files} files of {FILE_BYTES // 1024} KiB at once, {args.latency_ms:g} ms a call "
          f"(median of {args.repeats}):")
    print(f"  libfuse's default threads ({LIBFUSE_DEFAULT_THREADS}, and as many read-ahead requests): {baseline:,.0f} calls/s")
    print(f"  the emulator's ({chosen} threads and read-ahead requests): {emulator:,.0f} calls/s  "
          f"{emulator / baseline:.2f}x")
    print(f"  every call at once would be {ideal:,.0f} calls/s; the emulator reaches {emulator / ideal:.0%} of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
