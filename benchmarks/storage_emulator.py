"""Benchmark: does the storage emulator add the latency it is asked for, and little else?

One run serves a folder of small JPEG-sized files through each emulated store and reads every file
one at a time, with no latency (the baseline, measured here) and with --latency; then 16 at a time
with the latency. Printed per store:

- ms per file at 0 ms and at the latency, and the local folder's own time per file;
- latencies paid per file: (time at L - time at 0) / L. The requests the store counted per file say
  what it should be: 1 per GET on a kept-alive connection (s3, as s3fs reads); CONNECT, TLS
  handshake and GET on a new connection per request (gcs, as TF's gs:// reads); open and reads on a
  mount. A figure well above the count means the emulator holds requests longer than asked;
- parallel speed-up: files/s with 16 readers over files/s with 1, both at the latency (requests in
  flight overlap their waits, as on a network: up to 16).

usage: python benchmarks/storage_emulator.py [--files 96] [--latency-ms 10]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stallscope.storage.emulator import emulate  # noqa: E402
from stallscope.storage.emulator.fuse_mount import why_no_fuse  # noqa: E402

FILE_BYTES = 60_000


def make_folder(root: Path, files: int) -> list[str]:
    keys = []
    for i in range(files):
        key = f"class_{i % 4}/img_{i:04d}.jpg"
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(os.urandom(FILE_BYTES))
        keys.append(key)
    return keys


def s3_reader(store):
    """One kept-alive connection per reader thread, one GET per file (as s3fs's pooled connections)."""
    connections = {}

    def read(key: str) -> int:
        import threading

        me = threading.get_ident()
        if me not in connections:
            connections[me] = http.client.HTTPConnection("127.0.0.1", store.port, timeout=30)
        connections[me].request("GET", f"/{store.url[5:]}/{key}")
        return len(connections[me].getresponse().read())

    return read


def gcs_reader(store):
    """A new CONNECT tunnel and TLS session per file (as TF's gs:// client opens one per request)."""
    context = ssl.create_default_context(cafile=store.env["CURL_CA_BUNDLE"])

    def read(key: str) -> int:
        connection = http.client.HTTPSConnection("127.0.0.1", store.port, timeout=30, context=context)
        connection.set_tunnel("storage.googleapis.com", 443)
        connection.request("GET", f"/{store.url[5:]}/{key}")
        size = len(connection.getresponse().read())
        connection.close()
        return size

    return read


def mount_reader(store):
    def read(key: str) -> int:
        with open(Path(store.url) / key, "rb") as handle:
            return len(handle.read())

    return read


def timed(read, keys: list[str], readers: int) -> float:
    """Seconds per file, reading every key once with `readers` threads."""
    started = time.perf_counter()
    if readers == 1:
        sizes = [read(key) for key in keys]
    else:
        with concurrent.futures.ThreadPoolExecutor(readers) as pool:
            sizes = list(pool.map(read, keys))
    elapsed = time.perf_counter() - started
    assert all(size == FILE_BYTES for size in sizes), "a read came back short"
    return elapsed / len(keys)


def measure(kind: str, folder: Path, keys: list[str], latency_s: float, scratch: Path) -> dict:
    reader = {"s3": s3_reader, "gcs": gcs_reader, "mount": mount_reader}[kind]
    results = {}
    for label, latency, readers in (("base", 0.0, 1), ("seq", latency_s, 1), ("par", latency_s, 16)):
        options = {}
        if kind == "mount":
            mount = scratch / f"mnt-{label}"
            mount.mkdir()
            options["mount_point"] = mount
        with emulate(folder, kind=kind, latency_s=latency, max_duration_s=600, **options) as store:
            read = reader(store)
            read(keys[0])  # the first connection or lookup is not what is measured
            before = store.counters().requests
            results[label] = timed(read, keys, readers)
            results[f"{label}_requests"] = (store.counters().requests - before) / len(keys)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=96)
    parser.add_argument("--latency-ms", type=float, default=10.0)
    args = parser.parse_args()
    latency_s = args.latency_ms / 1000.0
    kinds = ["s3", "gcs"] + ([] if why_no_fuse() else ["mount"])
    with tempfile.TemporaryDirectory(prefix="stallscope-bench-emulator-") as scratch_name:
        scratch = Path(scratch_name)
        folder = scratch / "data"
        keys = make_folder(folder, args.files)
        local = timed(lambda key: len((folder / key).read_bytes()), keys, 1)
        print(f"{args.files} files of {FILE_BYTES // 1000} KB, latency {args.latency_ms:g} ms; "
              f"local folder: {local * 1e3:.2f} ms per file")
        print(f"{'store':6} {'0 ms':>9} {f'{args.latency_ms:g} ms':>9} {'requests/file':>14} "
              f"{'latencies paid/file':>20} {'16 readers: speed-up':>21}")
        for kind in kinds:
            r = measure(kind, folder, keys, latency_s, scratch)
            paid = (r["seq"] - r["base"]) / latency_s if latency_s else float("nan")
            print(f"{kind:6} {r['base'] * 1e3:7.2f}ms {r['seq'] * 1e3:7.2f}ms {r['seq_requests']:14.2f} "
                  f"{paid:20.2f} {r['seq'] / r['par']:20.1f}x")
        if "mount" not in kinds:
            print(f"mount: skipped ({why_no_fuse()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
