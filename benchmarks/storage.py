"""Benchmark: the storage what-if against real training runs on the storage emulator, in one run.

A synthetic data set (`stallscope prepare synthetic`: 1,600 ImageNet-like JPEGs of ~75 KB, as the issue
measured; `--long-side 200-300 --images-per-class 40` makes 160 of ~20 KB for a quick look), converted to
TFRecords by `stallscope convert` (4 training shards), is served by `stallscope.storage.emulator` with a
per-request latency of 0, 3, 10 and 30 ms. gcs: each pipeline reads through the gs:// reader its
`gcs_reader` names (`seed` and the fixed config: TF's own gs://, a new TLS connection per request;
`tuned`: stallscope's pooled reader on obstore, kept-alive connections); s3: stallscope's reader.
For each format (files, records) and pipeline (the `seed` and `tuned` presets, and the config
`stallscope diagnose --fix` writes for seed), a real `stallscope train` run reads it through the
store in a subprocess (TF reads its gs:// settings at first use), with an emulated accelerator fast
enough that input dominates; the local-disk run is the baseline measured in the same run. Each run
leaves its first pass over the training images out as warm-up, then measures whole passes for about
`--seconds` at the cell's predicted pace (at least `--steps`): a fixed step count either measures a fast
pipeline's start-up alone, or the seed pipeline's shuffle buffer, which holds a whole pass of a small set.

The prediction for each cell comes from `stallscope diagnose --json --what-if-storage` run on the
local copy (as a user asks it before moving data), the cell that is the config as it stands
(`as_configured`). The emulator runs on the same cores as the reader, which a real store does not:
its CPU per request (the serving process's CPU time over its requests, measured in each run) is
given to the same model as `server_cpu_ms_per_request` for the second prediction ("+server").
Printed: measured and predicted images/s and predicted / measured; then the worst ratios against
the target (within 25%) and, at 10 ms, `tuned` against its own local-disk images/s (targets: files
>= 0.8x, records >= 0.9x), and against itself through the same store at 0 ms, which pays the same
request CPU without the latency: the share of the latency that parallel reads hide.

usage: python benchmarks/storage.py [--latencies 0,3,10,30] [--store gcs|s3] [--presets seed,tuned,fixed]
                                    [--steps 40] [--seconds 4] [--long-side 400-600] [--repeats 1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import psutil  # noqa: E402

from stallscope.analysis import storage_whatif as sw  # noqa: E402
from stallscope.analysis.storage_whatif import as_configured_mode  # noqa: E402
from stallscope.pipeline.config import PipelineConfig  # noqa: E402
from stallscope.storage import s3_request_plan  # noqa: E402
from stallscope.storage.emulator import emulate  # noqa: E402

ACCELERATOR = "emulated:20000"   # 0.8 ms per batch of 16: input dominates every run here
BATCH = 16
COMMON = ["--batch-size", str(BATCH), "--image-size", "96", "--model", "mobilenet", "--weights", "none",
          "--accelerator", ACCELERATOR]
# The what-if's client: s3:// data's reader (obstore where installed, STALLSCOPE_S3_READER); for gs://
# None, the reader each pipeline's gcs_reader names, as `diagnose` picks it.
CLIENT = {"gcs": None, "s3": s3_request_plan.reader_name()}
TARGET_RATIO = 0.25
TARGET_TUNED_AT_10 = {"files": 0.8, "records": 0.9}


def stallscope(args: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> str:
    result = subprocess.run([sys.executable, "-m", "stallscope", *args], capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"stallscope {' '.join(args[:1])} failed ({result.returncode}): {result.stderr[-800:]}")
    return result.stdout


def make_data(scratch: Path, classes: int, per_class: int, long_side: str) -> dict[str, Path]:
    files = scratch / "files"
    stallscope(["prepare", "synthetic", "--output", str(files), "--classes", str(classes), "--images-per-class",
                str(per_class), "--long-side", long_side, "--workers", "2"])
    records = scratch / "records"
    stallscope(["convert", str(files), "--output-path", str(records), "--train-shards", "4",
                "--validation-shards", "1", "--workers", "1", "--no-progress"])
    return {"files": files, "records": records}


def pipeline_args(preset: str, fixed: dict[str, Path], fmt: str) -> list[str]:
    return ["--pipeline-config", str(fixed[fmt])] if preset == "fixed" else ["--pipeline", preset]


def train_rate(fmt: str, path: str, preset_args: list[str], steps: tuple[int, int], run_dir: Path,
               env: dict[str, str] | None = None) -> float:
    total, warmup = steps
    stallscope(["train", "--source", fmt, "--dataset_path", path, "--steps", str(total), "--warmup-steps", str(warmup),
                "--log-path", str(run_dir), *COMMON, *preset_args], env=env)
    return float(json.loads((run_dir / "summary.json").read_text())["images_per_second"])


def run_steps(predicted_images_per_s: float, examples: int, args: argparse.Namespace) -> tuple[int, int]:
    """(steps, warm-up steps): a first pass over the training images left out as warm-up, then whole passes
    that fill `--seconds` at the predicted pace (at least one, at least `--steps` in all, at most
    `--max-steps` measured). Whole passes: the seed pipeline's shuffle buffer (10,240) holds a whole pass of
    a small data set, so its first step reads the pass and the others read nothing; any other share of a
    pass would measure that buffer, not the store. The prediction only sets how long a cell is measured."""
    per_pass = max(1, math.ceil(examples / BATCH))
    wanted = predicted_images_per_s * args.seconds / BATCH if math.isfinite(predicted_images_per_s) else 0
    passes = max(1, math.ceil(max(wanted, args.steps) / per_pass))
    passes = max(1, min(passes, args.max_steps // per_pass))
    return per_pass * (passes + 1), per_pass


def split_cores(store_cores: int) -> set[int]:
    """The cores the store gets when it has `store_cores` of its own (the last ones); this process, and
    so every run it starts, keeps the others. Empty where the store shares every core."""
    cores = sorted(os.sched_getaffinity(0))
    if not store_cores:
        return set()
    if store_cores >= len(cores):
        raise SystemExit(f"--store-cores: expected fewer than the {len(cores)} core(s) this process may use, got {store_cores}")
    os.sched_setaffinity(0, cores[:-store_cores])
    return set(cores[-store_cores:])


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of process `pid` onto `cores` (threads it starts later inherit them)."""
    for thread in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(thread), cores)


def server_cpu_ms(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return (times.user + times.system) * 1000.0


def diagnose(fmt: str, path: Path, preset_args: list[str], latencies: list[float], client: str | None,
             work: Path) -> dict:
    """A local diagnosis asked about each latency (unlimited bandwidth), through `client` (None: the one
    the pipeline's gcs_reader names)."""
    spec = ",".join(f"{ms:g}ms,unlimited" for ms in latencies)
    chosen = ["--storage-client", client] if client else []
    out = stallscope(["diagnose", "--source", fmt, "--dataset_path", str(path), "--what-if-storage", spec,
                      *chosen, "--json", "--work-dir", str(work), *COMMON, *preset_args])
    return json.loads(out)


def predictions(diagnosis: dict, fmt: str, latencies: list[float]) -> dict[float, float]:
    """images/s the diagnosis' what-if gives the config as it stands, per latency."""
    config = PipelineConfig.from_dict(diagnosis["pipeline"])
    mode = as_configured_mode(config, fmt)
    result = {}
    for scenario, ms in zip(diagnosis["storage_what_if"]["scenarios"], latencies):
        row = next(f for f in scenario["formats"] if f["format"] == fmt)
        result[ms] = row[mode]["images_per_second"]
    return result


def with_server_cpu(diagnosis: dict, fmt: str, ms: float, client: str, server_ms_per_request: float) -> float:
    """The same model, from the diagnosis' own figures, with the co-located store's CPU per request."""
    config = PipelineConfig.from_dict(diagnosis["pipeline"])
    source = diagnosis["source"]
    pattern = sw.pattern_for(fmt, examples=source["examples"], total_bytes=source["bytes"], files=source["files"])
    workload = sw.Workload(**diagnosis["storage_what_if"]["workload"])
    row = sw.predict_format(pattern, sw.StorageScenario("emulated", ms, float("inf")), sw.client_named(client),
                            config, workload, server_cpu_ms_per_request=server_ms_per_request)
    return sw.as_configured(row, config).images_per_second


def fixed_configs(data: dict[str, Path], formats: list[str], scratch: Path) -> dict[str, Path]:
    """The config `stallscope diagnose --fix` writes for the seed pipeline, per format."""
    fixed = {}
    for fmt in formats:
        fixed[fmt] = scratch / f"fixed-{fmt}.json"
        stallscope(["diagnose", "--source", fmt, "--dataset_path", str(data[fmt]), "--pipeline", "seed", "--fix",
                    "--fixed-config", str(fixed[fmt]), "--work-dir", str(scratch / f"fix-{fmt}"), *COMMON])
    return fixed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latencies", default="0,3,10,30", help="per-request latencies in ms")
    parser.add_argument("--store", choices=sorted(CLIENT), default="gcs")
    parser.add_argument("--presets", default="seed,tuned,fixed", help="seed, tuned and/or fixed (diagnose --fix)")
    parser.add_argument("--formats", default="files,records")
    parser.add_argument("--steps", type=int, default=40, help="the fewest measured training steps per run (batch 16)")
    parser.add_argument("--seconds", type=float, default=4.0, help="each run takes at least the steps its predicted "
                        "images/s fills this many seconds with (at most --max-steps): a fast pipeline's 40 steps "
                        "last a tenth of a second, which measures its start, not its steady pace")
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--images-per-class", type=int, default=400, help="over both splits; 80%% train, in 4 shards")
    parser.add_argument("--long-side", default="400-600", help="image size range in pixels: ImageNet-like (~75 KB "
                        "JPEGs); 200-300 makes ~20 KB ones")
    parser.add_argument("--repeats", type=int, default=1, help="runs per cell, local disk and remote taken in "
                        "turn; medians are reported")
    parser.add_argument("--store-cores", type=int, default=0, help="give the store this many cores of its own (the "
                        "last ones) and every training run, local disk included, the others: a store that does "
                        "not share the reader's cores, as a real one does not (0: all share every core)")
    parser.add_argument("--quick", action="store_true", help="only 10 ms, tuned (about two minutes)")
    args = parser.parse_args()
    latencies = [10.0] if args.quick else [float(x) for x in args.latencies.split(",")]
    presets = ["tuned"] if args.quick else args.presets.split(",")
    formats = args.formats.split(",")
    client = CLIENT[args.store]
    store_cores = split_cores(args.store_cores)
    started = time.perf_counter()
    rows = []
    clients: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory(prefix="stallscope-bench-storage-") as scratch_name:
        scratch = Path(scratch_name)
        data = make_data(scratch, args.classes, args.images_per_class, args.long_side)
        fixed = fixed_configs(data, formats, scratch) if "fixed" in presets else {}
        for fmt in formats:
            for preset in presets:
                preset_args = pipeline_args(preset, fixed, fmt)
                diagnosis = diagnose(fmt, data[fmt], preset_args, latencies, client, scratch / f"d-{fmt}-{preset}")
                read_by = diagnosis["storage_what_if"]["object_client"]
                clients[(fmt, preset)] = read_by
                predicted = predictions(diagnosis, fmt, latencies)
                # Local disk is at least as fast as the fastest remote prediction.
                examples = diagnosis["source"]["examples"]
                steps = {where: run_steps(rate, examples, args) for where, rate in
                         [("local", max(predicted.values())), *predicted.items()]}
                # Each repeat runs local disk and then every latency, so a drift in the machine's speed
                # over the run reaches the baseline and the remote cells alike; medians are reported.
                local_runs: list[float] = []
                runs: dict[float, list[tuple[float, float]]] = {ms: [] for ms in latencies}
                for repeat in range(args.repeats):
                    local_runs.append(train_rate(fmt, str(data[fmt]), preset_args, steps["local"],
                                                 scratch / f"run-{fmt}-{preset}-local-{repeat}"))
                    for ms in latencies:
                        with emulate(data[fmt], kind=args.store, latency_s=ms / 1000.0, max_duration_s=900) as store:
                            if store_cores:
                                pin(store.pid, store_cores)
                            idle = server_cpu_ms(store.pid)
                            measured = train_rate(fmt, store.url, preset_args, steps[ms],
                                                  scratch / f"run-{fmt}-{preset}-{ms:g}-{repeat}", env=store.env)
                            per_request = (server_cpu_ms(store.pid) - idle) / max(1, store.counters().requests)
                        runs[ms].append((measured, per_request))
                        print(f"  {fmt} {preset} {ms:g} ms: {measured:.0f} measured (local disk "
                              f"{local_runs[-1]:.0f}), {predicted[ms]:.0f} predicted, the store's "
                              f"{per_request:.2f} ms CPU per request", file=sys.stderr, flush=True)
                rows.append((fmt, preset, "local", statistics.median(local_runs), None, None))
                for ms in latencies:
                    measured = statistics.median(m for m, _ in runs[ms])
                    per_request = statistics.median(c for _, c in runs[ms])
                    # A store on cores of its own takes none of the reader's: no "+server" model then.
                    served = None if store_cores else with_server_cpu(diagnosis, fmt, ms, read_by, per_request)
                    rows.append((fmt, preset, f"{ms:g} ms", measured, predicted[ms], served))
    read_by = ", ".join(f"{fmt} {preset}: {name}" for (fmt, preset), name in clients.items())
    print(f"store: {args.store} ({read_by}), {args.classes * args.images_per_class} images, a pass of warm-up, then "
          f"whole passes of {BATCH}-image steps for {args.steps}-{args.max_steps} steps or ~{args.seconds:g} s at the "
          f"predicted pace, accelerator {ACCELERATOR}, median of {args.repeats} run(s) per cell")
    if store_cores:
        print(f"cores: the store on {sorted(store_cores)}, every training run (local disk too) on "
              f"{sorted(os.sched_getaffinity(0))}")
    print(f"{'format':8} {'pipeline':8} {'storage':8} {'measured':>9} {'predicted':>10} {'pred/meas':>10} "
          f"{'+server':>8} {'pred/meas':>10} {'vs local':>9}")
    rate_of = {(f, p, where): m for f, p, where, m, _, _ in rows}
    local_rate = {(f, p): m for (f, p, where), m in rate_of.items() if where == "local"}
    worst: dict[str, tuple] = {}

    def ratio_cell(name: str, predicted: float | None, measured: float, where: tuple) -> tuple[str, str]:
        if predicted is None or measured <= 0:
            return "", ""
        ratio = predicted / measured
        if name not in worst or abs(ratio - 1) > abs(worst[name][0] - 1):
            worst[name] = (ratio, *where)
        return f"{predicted:.0f}", f"{ratio:.2f}x"

    for fmt, preset, where, measured, predicted, served in rows:
        plain = ratio_cell("predicted", predicted, measured, (fmt, preset, where))
        plus = ratio_cell("+server", served, measured, (fmt, preset, where))
        vs_local = measured / local_rate[(fmt, preset)] if local_rate[(fmt, preset)] else float("nan")
        print(f"{fmt:8} {preset:8} {where:8} {measured:9.0f} {plain[0]:>10} {plain[1]:>10} {plus[0]:>8} {plus[1]:>10} "
              f"{vs_local:8.2f}x")
    for name, (ratio, fmt, preset, where) in worst.items():
        print(f"worst {name}/measured: {ratio:.2f}x ({fmt} {preset} {where}); target within {TARGET_RATIO:.0%} "
              f"({'met' if abs(ratio - 1) <= TARGET_RATIO else 'NOT met'})")
    for fmt, floor in TARGET_TUNED_AT_10.items():
        at10, at0 = (rate_of.get((fmt, "tuned", where)) for where in ("10 ms", "0 ms"))
        if at10 is not None and local_rate.get((fmt, "tuned")):
            share = at10 / local_rate[(fmt, "tuned")]
            print(f"tuned {fmt} at 10 ms: {share:.3f}x its local-disk images/s (target >= {floor}x: "
                  f"{'met' if share >= floor else 'NOT met'})")
            if at0:  # the same store and its CPU, without the latency: how much of the 10 ms is hidden
                print(f"  and {at10 / at0:.3f}x its images/s through the same store at 0 ms")
    print(f"took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
