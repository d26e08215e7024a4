"""Benchmark: is stallscope's fix as good as a search by hand, wherever the data lives?

For each cell (storage x format) of the built-in data set, in one run against an emulated device:
- the stalled variant, the seeds' pipeline (`seed`): `diagnose --fix` gives its fix (the advice applied,
  and where it fell short, the candidates it tried) and each listed fix's predicted gain;
- a search by hand over reads in flight x the private pool (x map parallelism autotune, prefetch), the
  seed's other knobs kept;
- every config (seed, the fix, each searched one) trained by the same harness (`run_training`) until its
  images/s is measured to the same precision (its halves within 5%), so their images/s compare;
- the healthy variant (`tuned` on local disk, and on each storage): whether a fix is advised at all.

Printed: per cell seed, fix, best found, fix / best (target >= 0.8), each listed fix's predicted vs
measured gain (target: measured >= half the predicted), and for `tuned` on a mount its ratio to the lower
of `tuned` on local disk and the mount's own ceiling here (32 raw readers, no decode; target >= 0.7),
and how many configs reached the precision asked (those that did not are named, with their spread).

Storages: local disk, the emulator's FUSE mount and its gs:// and s3:// buckets at the latencies given (the
emulator shares these cores with the pipeline, as a real network file system or store would not: the
mount's ceiling is measured in the same run).

usage: python benchmarks/advice.py [--stores local,mount,gcs,s3] [--mount-latency-ms 2,10] [--bucket-latency-ms 10] [--formats files,records]
           [--images-per-class 48] [--accelerator emulated:4000] [--precision 0.05] [--steps 36]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READS_GRID = (2, 8, 16, 32)   # reads in flight searched by hand (pool: reads + cores)
RAW_READERS = 32
MIN_SECONDS, MAX_SECONDS = 3.0, 30.0  # of measured steps, each config measured to a precision


def prepare(scratch: Path, images_per_class: int) -> tuple[Path, Path]:
    """The built-in data set (10 classes, ImageNet-like JPEGs) and its records."""
    from stallscope.cli.main import main

    tree = scratch / "data"
    if main(["prepare", "synthetic", "--output", str(tree), "--images-per-class", str(images_per_class),
             "--validation-fraction", "0"]) != 0:
        raise SystemExit("prepare failed")
    records = scratch / "records"
    if main(["convert", "--dataset-path", str(tree), "--output-path", str(records), "--shards", "8"]) != 0:
        raise SystemExit("convert failed")
    return tree, records


SPREADS: list[tuple[str, float | None, bool]] = []  # (config, its halves' spread, target reached), this cell


def trained_rate(source: str, path: Path, config, *, accelerator: str, steps: int, precision: float,
                 run_dir: Path) -> float:
    """images/s of `config` under the harness every config of a cell runs under: trained until the
    images/s of its measured steps' two halves agree within `precision` (at least MIN_SECONDS, at most
    MAX_SECONDS of measured steps), or for `steps` steps where `precision` is 0. A window of 36 steps
    (~1.5 s at 750 images/s) moved a config by 16% between its halves: a fix's gain is measured to a
    stated precision, or not at all."""
    from stallscope.workload.precision import PrecisionTarget
    from stallscope.workload.train import TrainOptions, run_training

    length = {"precision": PrecisionTarget(precision, min_seconds=MIN_SECONDS, max_seconds=MAX_SECONDS)} \
        if precision else {"steps": steps}
    options = TrainOptions(source=source, dataset_path=path, pipeline=config, accelerator=accelerator,
                           log_path=run_dir, **length)
    result = run_training(options)
    reached = result.summary.get("precision", {})
    SPREADS.append((run_dir.name, reached.get("spread"), bool(reached.get("reached"))))
    return result.stats.images_per_second


def raw_ceiling(folder: Path, seconds: float = 3.0) -> float:
    """Files/s that RAW_READERS threads read whole from `folder` (no decode): the storage's own ceiling."""
    files = sorted(str(p) for p in folder.rglob("*") if p.is_file())
    done, ends = [0], time.monotonic() + seconds

    def reader(start: int) -> None:
        i = start
        while time.monotonic() < ends:
            with open(files[i % len(files)], "rb") as handle:
                handle.read()
            done[0] += 1
            i += RAW_READERS
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(RAW_READERS) as pool:
        list(pool.map(reader, range(RAW_READERS)))
    return done[0] / (time.monotonic() - started)


@contextlib.contextmanager
def storage(kind: str, tree: Path, records: Path, scratch: Path, latency_ms: float):
    """(tree, records, env) as seen on `kind`: "local", the FUSE mount, or the emulated gs:// / s3:// bucket,
    at `latency_ms` a request; env: the variables a reader of the bucket needs."""
    if kind == "local":
        yield tree, records, {}
        return
    from stallscope.storage.emulator import emulate

    if kind == "mount":
        mount = scratch / f"mnt-{latency_ms:g}"
        mount.mkdir(exist_ok=True)
        with emulate(scratch / "served", kind="mount", mount_point=mount, latency_s=latency_ms / 1000.0,
                     max_duration_s=3600):
            yield mount / "data", mount / "records", {}
        return
    with emulate(scratch / "served", kind=kind, latency_s=latency_ms / 1000.0, max_duration_s=3600) as store:
        yield f"{store.url}/data", f"{store.url}/records", store.env


STORAGE_LABELS = {"local": "local disk", "mount": "mount", "gcs": "gs://", "s3": "s3://"}


def diagnose_fix(source: str, path: Path, config, *, accelerator: str, fixed: Path) -> dict:
    from stallscope.analysis.differential import DiagnoseOptions, diagnose, open_probed_source
    from stallscope.analysis.fix_loop import fix
    from stallscope.workload.train import TrainOptions

    options = DiagnoseOptions(train=TrainOptions(source=source, dataset_path=path, pipeline=config,
                                                 accelerator=accelerator), probe_steps=20, pipeline_budget_s=5.0)
    opened = open_probed_source(options)
    found = diagnose(options, source=opened)
    result = None
    if any(a.knobs for a in found.advice):
        result = fix(options, found, save_to=fixed, source=opened)
    return {"diagnosis": found, "fix": result}


def measure_cell(spec: dict) -> dict:
    """One storage x format cell, in a process of its own: prepared as `stallscope train` prepares one
    (TF's gs:// settings and the records' heap padding before TensorFlow loads), so each cell reads its
    store as the CLI would."""
    from stallscope.cli.flags import apply_storage_flags

    fmt, path = spec["format"], spec["path"]
    apply_storage_flags(argparse.Namespace(command="train", source=fmt, dataset_path=path, storage_timeout=None))

    from stallscope.analysis.advice import apply_advice
    from stallscope.config import AUTOTUNE
    from stallscope.cpu_limits import current
    from stallscope.pipeline.presets import get_preset, tuned_for_source
    from stallscope.pipeline.sources import open_source
    from stallscope.storage.location import as_path
    from stallscope.tfimport import import_tensorflow

    import_tensorflow()
    cores = current().whole_cores
    path = as_path(path)
    run = Path(spec["run"])
    accelerator, steps = spec["accelerator"], spec["steps"]

    def rate(config, name):
        return trained_rate(fmt, path, config, accelerator=accelerator, steps=steps, precision=spec["precision"],
                            run_dir=run / name)

    seed = get_preset("seed")
    seed_rate = rate(seed, "seed")
    found = diagnose_fix(fmt, path, seed, accelerator=accelerator, fixed=run / "fixed.json")
    fix = found["fix"]
    fix_rate = rate(fix.config, "fix") if fix is not None else seed_rate
    # by hand: reads in flight x a private pool of reads + cores, parallel decode, prefetch; on gs:// through
    # the pooled reader too (TF's client opens a connection per request whatever the pool)
    readers = ("tf", "pooled") if str(path).startswith("gs://") else ("tf",)
    searched = {}
    for reader in readers:
        for reads in READS_GRID:
            config = seed.replace(read_parallelism=reads, private_threadpool_size=reads + cores,
                                  map_parallelism=AUTOTUNE, prefetch=AUTOTUNE, deterministic=False, gcs_reader=reader)
            searched[(reader, reads)] = rate(config, f"{reader}-reads-{reads}")
    best_at = max(searched, key=searched.get)
    cell = {"storage": spec["label"], "format": fmt, "seed": seed_rate, "fix": fix_rate,
            "best": max(searched[best_at], seed_rate), "best_reads": best_at[1], "best_reader": best_at[0],
            "fix_config": fix.config_changes if fix else {}, "tried": len(fix.trials) if fix else 0}
    cell["fix_over_best"] = fix_rate / cell["best"]
    # every listed fix carries its predicted gain: each applied alone to the seed, as it was priced; a
    # conversion to records is measured by the records cell of the same storage (filled in by main)
    gains = []
    for advice in found["diagnosis"].advice:
        if advice.predicted_gain is None:
            continue
        measured = rate(apply_advice(seed, advice), f"alone-{advice.key}") / seed_rate - 1.0 if advice.knobs else None
        gains.append({"storage": spec["label"], "format": fmt, "fix": advice.key,
                      "predicted_gain": advice.predicted_gain, "measured_gain": measured})
    # tuned, as train reads this storage; and the healthy variant: tuned feeding a device it keeps up with
    tuned_rate = rate(tuned_for_source(get_preset("tuned"), open_source(fmt, path)), "tuned")
    healthy = diagnose_fix(fmt, path, get_preset("tuned"), accelerator=spec["healthy_accelerator"],
                           fixed=run / "tuned-fixed.json")["diagnosis"]
    tuned = {"storage": spec["label"], "format": fmt, "tuned": tuned_rate, "verdict": healthy.verdict,
             "fixes": [a.key for a in healthy.advice]}
    return {"cell": cell, "gains": gains, "tuned": tuned, "spreads": SPREADS}


def run_cell(spec: dict, env: dict[str, str]) -> dict:
    """measure_cell in a child process with the store's variables; its figures come back as JSON."""
    out = Path(spec["run"]) / "cell.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, **env, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    subprocess.run([sys.executable, __file__, "--cell", json.dumps(spec), "--json", str(out)], env=child_env,
                   check=True, timeout=3600)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="local,mount,gcs,s3", help="which storages have cells")
    parser.add_argument("--mount-latency-ms", default="2,10")
    parser.add_argument("--bucket-latency-ms", default="10", help="gs:// and s3:// cells at these latencies ('' for none)")
    parser.add_argument("--formats", default="files,records")
    parser.add_argument("--images-per-class", type=int, default=48)
    parser.add_argument("--accelerator", default="emulated:4000")
    parser.add_argument("--precision", type=float, default=0.05,
                        help="train each config until its halves' images/s agree within this share "
                             f"({MIN_SECONDS:g}-{MAX_SECONDS:g} s of steps); 0: a fixed --steps")
    parser.add_argument("--steps", type=int, default=36, help="training steps of each config with --precision 0")
    parser.add_argument("--healthy-accelerator", default="emulated:200",
                        help="the device the healthy variant (tuned) keeps up with on every storage")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # one cell, in a child process
    args = parser.parse_args()
    if args.cell:
        args.json.write_text(json.dumps(measure_cell(json.loads(args.cell))))
        return

    from stallscope.cpu_limits import current

    cores = current().whole_cores
    kinds = args.stores.split(",")
    stores = ([("local", 0.0)] + [("mount", float(x)) for x in args.mount_latency_ms.split(",") if x]
              + [(kind, float(x)) for kind in ("gcs", "s3") for x in args.bucket_latency_ms.split(",") if x])
    stores = [(kind, latency) for kind, latency in stores if kind in kinds]
    formats = [f for f in args.formats.split(",") if f]
    rows, gains, tuned_rows, spreads = [], [], [], []
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        served = scratch / "served"
        served.mkdir()
        tree, records = prepare(served, args.images_per_class)
        tuned_local = {}
        for kind, latency in stores:
            with storage(kind, tree, records, scratch, latency) as (tree_at, records_at, env):
                label = STORAGE_LABELS[kind] + ("" if kind == "local" else f" {latency:g} ms")
                ceiling = raw_ceiling(tree_at) if kind == "mount" else None
                for fmt in formats:
                    spec = {"label": label, "format": fmt,
                            "path": f"{tree_at}/train" if fmt == "files" else str(records_at),
                            "run": str(scratch / "runs" / f"{kind}-{latency:g}-{fmt}"),
                            "accelerator": args.accelerator, "steps": args.steps, "precision": args.precision,
                            "healthy_accelerator": args.healthy_accelerator}
                    measured = run_cell(spec, env)
                    rows.append(measured["cell"])
                    gains += measured["gains"]
                    spreads += [(label, fmt, *spread) for spread in measured["spreads"]]
                    if kind == "local":
                        tuned_local[fmt] = measured["tuned"]["tuned"]
                    tuned_rows.append({**measured["tuned"], "ceiling": ceiling, "tuned_local": tuned_local.get(fmt)})
                    print(f"  done: {label} {fmt}", file=sys.stderr, flush=True)

    length = (f"each config to {args.precision:.0%} ({MIN_SECONDS:g}-{MAX_SECONDS:g} s)" if args.precision
              else f"{args.steps} steps a config")
    print(f"advice benchmark: {args.images_per_class * 10} JPEGs, {args.accelerator}, {length}, {cores} cores; images/s")
    print(f"  {'storage':<12}{'format':<9}{'seed':>8}{'fix':>8}{'best':>8}  {'fix/best':>8}  best by hand          fix")
    for r in rows:
        knobs = ", ".join(f"{k}={v}" for k, v in r["fix_config"].items()
                          if k in ("read_parallelism", "private_threadpool_size", "cache", "map_parallelism",
                                   "gcs_reader"))
        by_hand = f"{r['best_reads']:>3} in flight" + (" pooled" if r["best_reader"] == "pooled" else "")
        print(f"  {r['storage']:<12}{r['format']:<9}{r['seed']:>8,.0f}{r['fix']:>8,.0f}{r['best']:>8,.0f}  "
              f"{r['fix_over_best']:>7.2f}x  {by_hand:<20}  {knobs} ({r['tried']} tried)")
    seeds = {(r["storage"], r["format"]): r["seed"] for r in rows}
    for g in gains:  # files converted to records: the records cell's seed against the files cell's
        if g["fix"] == "convert_records" and (g["storage"], "records") in seeds:
            g["measured_gain"] = seeds[(g["storage"], "records")] / seeds[(g["storage"], "files")] - 1.0
    print("each listed fix applied alone: predicted vs measured gain (target: measured >= half the predicted)")
    for g in gains:
        if g["measured_gain"] is None:
            print(f"  {g['storage']:<12}{g['format']:<9}{g['fix']:<20}predicted {g['predicted_gain']:+7.0%}  "
                  "not measured here (outside the pipeline config)")
            continue
        held = "ok" if g["measured_gain"] >= 0.5 * g["predicted_gain"] else "SHORT"
        print(f"  {g['storage']:<12}{g['format']:<9}{g['fix']:<20}predicted {g['predicted_gain']:+7.0%}  "
              f"measured {g['measured_gain']:+7.0%}  {held}")
    print(f"tuned: on a mount, against min(tuned on local disk, the mount's ceiling of 32 raw readers); the healthy "
          f"variant (tuned feeding {args.healthy_accelerator}): no fix expected")
    for t in tuned_rows:
        ref = min(x for x in (t["tuned_local"], t["ceiling"]) if x) if t["ceiling"] else None
        ratio = f"{t['tuned'] / ref:.2f}x of {ref:,.0f}" if ref else "-"
        print(f"  {t['storage']:<12}{t['format']:<9}tuned {t['tuned']:>7,.0f}  {ratio:<18} healthy variant: {t['verdict']:<10} "
              f"fixes: {', '.join(t['fixes']) or 'none'}")
    if args.precision:
        short = [f"{label} {fmt} {name} ({'-' if spread is None else f'{spread:.0%}'})"
                 for label, fmt, name, spread, reached in spreads if not reached]
        print(f"precision: {len(spreads) - len(short)} of {len(spreads)} configs measured within {args.precision:.0%}"
              + (f"; not: {', '.join(short)}" if short else ""))
    if args.json:
        args.json.write_text(json.dumps({"cells": rows, "gains": gains, "tuned": tuned_rows, "spreads": spreads},
                                        indent=2))


if __name__ == "__main__":
    main()
