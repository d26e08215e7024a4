"""Benchmark: what `diagnose` measures of a bucket that keeps no counters, against the store's known
latency, in one run.

A synthetic data set (`stallscope prepare synthetic`, ImageNet-like JPEGs of ~75 KB, and the same as 4
training shards by `stallscope convert`) is served by
`stallscope storage serve` (`--store s3`, or gcs) at each of `--latencies`, with no counters file given
to `diagnose`. For the `seed` pipeline (one read at a time) and `tuned` (many in flight), one
`stallscope diagnose --json` run per latency prints:
  as read      the store's latency the what-if takes (the fastest tenth of 24 one-byte GETs asked one at
               a time after the probes, less the client's own overhead per request), beside the latency
               the emulator holds each request; Mbit/s: its bandwidth, measured for records only (4 MiB
               ranged GETs of the shards), beside `--bandwidth`
  median, p90  the pipeline's own requests' times from asking to the last byte, as stallscope's reader
               counted them (they waited for busy cores too: why the latency is not taken from them);
               "-" where TF's own gs:// client read (`--store gcs`, `seed`), which counts nothing
  req/image    requests per image: counted by stallscope's reader (per byte received), else modelled
  probe        images/s of the pipeline alone, measured from the store (the warm probe)
  predicted    images/s the what-if gives the pipeline as configured at the store as read: the model
               fed with the measured latency should give back the rate just measured
Every figure comes from the same run; the store runs on the same cores as the reader, which a real
store does not (its CPU per request is not in the model).

  python benchmarks/store_as_read.py [--store s3|gcs --latencies 0,3,10,30 --formats files,records
                                     --bandwidth MBIT --images-per-class 100]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stallscope.analysis.storage_whatif import as_configured_mode  # noqa: E402
from stallscope.pipeline.config import PipelineConfig  # noqa: E402
from stallscope.storage.emulator import emulate  # noqa: E402

PIPELINES = ("seed", "tuned")
COMMON = ["--batch-size", "16", "--image-size", "96", "--model", "mobilenet", "--weights", "none",
          "--accelerator", "emulated:20000", "--probe-steps", "6"]


def stallscope(args: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run([sys.executable, "-m", "stallscope", *args], capture_output=True, text=True, timeout=900,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    if result.returncode != 0:
        raise SystemExit(f"stallscope {args[0]} failed ({result.returncode}): {result.stderr[-800:]}")
    return result.stdout


def row(report: dict) -> dict:
    """The figures of one diagnosis: the store as read, the request times, and measured vs predicted."""
    storage = report["storage"]
    as_read = next((s for s in report["storage_what_if"]["scenarios"] if s["scenario"]["name"] == "as read"), None)
    predicted = None
    if as_read is not None:
        config = PipelineConfig.from_dict(report["pipeline"])
        source = report["source"]["kind"]
        cell = next(f for f in as_read["formats"] if f["format"] == source)
        predicted = cell[as_configured_mode(config, source)]["images_per_second"]
    bandwidth = as_read["scenario"]["bandwidth_bytes_per_s"] if as_read else None
    return {"as_read_ms": as_read["scenario"]["latency_ms"] if as_read else None,
            "as_read_mbit": bandwidth * 8 / 1e6 if bandwidth is not None and math.isfinite(bandwidth) else None,
            "median_ms": storage.get("request_ms_median"), "p90_ms": storage.get("request_ms_p90"),
            "requests": storage["requests"], "basis": storage["basis"],
            "probe": report["probes"]["warm"]["images_per_second"], "predicted": predicted}


def cell(value, spec: str) -> str:
    """`value` as `spec` ("7.1f") formats it, or a dash as wide."""
    return f"{'-':>{spec.split('.')[0]}}" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("s3", "gcs"), default="s3")
    parser.add_argument("--latencies", default="0,3,10,30", help="per-request latencies in ms")
    parser.add_argument("--formats", default="files,records", help="files (JPEGs) and/or records (4 shards)")
    parser.add_argument("--bandwidth", type=float, default=None, metavar="MBIT",
                        help="the emulated store's shared bandwidth cap in Mbit/s (default: none)")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--images-per-class", type=int, default=100, help="over both splits; 80%% train")
    parser.add_argument("--pipeline-budget", type=float, default=6.0, help="seconds of each pipeline-alone probe")
    args = parser.parse_args()
    latencies = [float(x) for x in args.latencies.split(",")]
    formats = args.formats.split(",")
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="stallscope-bench-as-read-") as scratch_name:
        scratch = Path(scratch_name)
        stallscope(["prepare", "synthetic", "--output", str(scratch / "files"), "--classes", str(args.classes),
                    "--images-per-class", str(args.images_per_class), "--long-side", "400-600", "--workers", "2"])
        if "records" in formats:
            stallscope(["convert", str(scratch / "files"), "--output-path", str(scratch / "records"),
                        "--train-shards", "4", "--validation-shards", "1", "--workers", "1", "--no-progress"])
        cap = {"bandwidth_bps": args.bandwidth * 1e6} if args.bandwidth else {}
        for ms in latencies:
            with emulate(scratch, kind=args.store, latency_s=ms / 1000.0, max_duration_s=900, **cap) as store:
                for fmt in formats:
                    for pipeline in PIPELINES:
                        report = json.loads(stallscope(
                            ["diagnose", "--source", fmt, "--dataset_path", f"{store.url}/{fmt}", "--pipeline",
                             pipeline, "--pipeline-budget", str(args.pipeline_budget), "--json", *COMMON],
                            env=store.env))
                        rows.append((ms, fmt, pipeline, row(report)))
                        print(f"  {ms:g} ms {fmt} {pipeline}: {rows[-1][3]}", file=sys.stderr, flush=True)
    cap_text = f"{args.bandwidth:g} Mbit/s shared" if args.bandwidth else "no bandwidth cap"
    print(f"store: {args.store} (no counters file, {cap_text}), {args.classes * args.images_per_class} images of "
          f"~75 KB (records: 4 training shards), pipeline-alone probes of {args.pipeline_budget:g} s, 2 cores "
          "shared with the store")
    print(f"{'latency':>8} {'format':<8} {'pipeline':<8} {'as read':>8} {'Mbit/s':>8} {'median':>8} {'p90':>8} "
          f"{'req/image':>10} {'basis':<9}{'probe':>8} {'predicted':>10} {'pred/meas':>10}")
    worst_latency = worst_rate = 1.0
    for ms, fmt, pipeline, r in rows:
        ratio = r["predicted"] / r["probe"] if r["predicted"] and r["probe"] else None
        print(f"{ms:>6g}ms {fmt:<8} {pipeline:<8} {cell(r['as_read_ms'], '7.1f')}  {cell(r['as_read_mbit'], '7.0f')}  "
              f"{cell(r['median_ms'], '7.1f')}  {cell(r['p90_ms'], '7.1f')}  {r['requests']:>9.3g} {r['basis']:<9}"
              f"{r['probe']:>8.0f} {cell(r['predicted'], '10.0f')} {cell(ratio, '9.2f')}x")
        if ratio:
            worst_rate = max(worst_rate, ratio, 1 / ratio)
        if r["as_read_ms"] is not None and ms > 0:
            worst_latency = max(worst_latency, r["as_read_ms"] / ms, ms / max(r["as_read_ms"], 1e-9))
    print(f"worst as-read latency / emulated latency (above 0 ms): {worst_latency:.2f}x; "
          f"worst predicted / probe at the store as read: {worst_rate:.2f}x")
    print(f"took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
