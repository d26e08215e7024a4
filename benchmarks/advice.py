"""Benchmark: is stallscope's fix as good as a search by hand, wherever the data lives?

For each cell (storage x format) of the built-in data set, in one run against an emulated device:
- the stalled variant, the seeds' pipeline (`seed`): `diagnose --fix` gives its fix (the advice applied,
  and where it fell short, the candidates it tried) and each listed fix's predicted gain;
- a search by hand over reads in flight x the private pool (x map parallelism autotune, prefetch), the
  seed's other knobs kept;
- every config (seed, the fix, each searched one) trained for the same steps by the same harness
  (`run_training`), so their images/s compare;
- the healthy variant (`tuned` on local disk, and on each storage): whether a fix is advised at all.

Printed: per cell seed, fix, best found, fix / best (target >= 0.8), each listed fix's predicted vs
measured gain (target: measured >= half the predicted), and for `tuned` on a mount its ratio to the lower
of `tuned` on local disk and the mount's own ceiling here (32 raw readers, no decode; target >= 0.7).

Storages: local disk and the emulator's FUSE mount at the latencies given (it shares these cores with the
pipeline, as a real network file system would not: its ceiling is measured in the same run).

usage: python benchmarks/advice.py [--mount-latency-ms 2,10] [--formats files,records]
           [--images-per-class 48] [--accelerator emulated:4000] [--steps 36]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import tempfile
import time
from pathlib import Path

READS_GRID = (2, 8, 16, 32)   # reads in flight searched by hand (pool: reads + cores)
RAW_READERS = 32


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


def trained_rate(source: str, path: Path, config, *, accelerator: str, steps: int, run_dir: Path) -> float:
    """images/s of `config` trained for `steps` steps (the harness every config of a cell runs under)."""
    from stallscope.workload.train import TrainOptions, run_training

    options = TrainOptions(source=source, dataset_path=path, pipeline=config, accelerator=accelerator,
                           steps=steps, log_path=run_dir)
    return run_training(options).stats.images_per_second


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
    """(tree, records) as seen on `kind`: "local", or the FUSE mount at `latency_ms`."""
    if kind == "local":
        yield tree, records
        return
    from stallscope.storage.emulator import emulate

    mount = scratch / f"mnt-{latency_ms:g}"
    mount.mkdir(exist_ok=True)
    with emulate(scratch / "served", kind="mount", mount_point=mount, latency_s=latency_ms / 1000.0,
                 max_duration_s=3600):
        yield mount / "data", mount / "records"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mount-latency-ms", default="2,10")
    parser.add_argument("--formats", default="files,records")
    parser.add_argument("--images-per-class", type=int, default=48)
    parser.add_argument("--accelerator", default="emulated:4000")
    parser.add_argument("--steps", type=int, default=36, help="training steps of each measured config")
    parser.add_argument("--healthy-accelerator", default="emulated:200",
                        help="the device the healthy variant (tuned) keeps up with on every storage")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    from stallscope.analysis.advice import apply_advice
    from stallscope.config import AUTOTUNE
    from stallscope.cpu_limits import current
    from stallscope.pipeline.presets import get_preset, tuned_for_source
    from stallscope.pipeline.sources import open_source
    from stallscope.tfimport import import_tensorflow

    import_tensorflow()
    cores = current().whole_cores
    stores = [("local", 0.0)] + [("mount", float(x)) for x in args.mount_latency_ms.split(",") if x]
    formats = [f for f in args.formats.split(",") if f]
    rows, gains, tuned_rows = [], [], []
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        served = scratch / "served"
        served.mkdir()
        tree, records = prepare(served, args.images_per_class)
        tuned_local = {}
        for kind, latency in stores:
            with storage(kind, tree, records, scratch, latency) as (tree_at, records_at):
                label = "local disk" if kind == "local" else f"mount {latency:g} ms"
                ceiling = raw_ceiling(tree_at) if kind == "mount" else None
                for fmt in formats:
                    path = (tree_at / "train") if fmt == "files" else records_at
                    run = scratch / "runs" / f"{kind}-{latency:g}-{fmt}"

                    def rate(config, name):
                        return trained_rate(fmt, path, config, accelerator=args.accelerator, steps=args.steps,
                                            run_dir=run / name)

                    seed = get_preset("seed")
                    seed_rate = rate(seed, "seed")
                    found = diagnose_fix(fmt, path, seed, accelerator=args.accelerator, fixed=run / "fixed.json")
                    fix = found["fix"]
                    fix_rate = rate(fix.config, "fix") if fix is not None else seed_rate
                    searched = {}
                    for reads in READS_GRID:
                        config = seed.replace(read_parallelism=reads, private_threadpool_size=reads + cores,
                                              map_parallelism=AUTOTUNE, prefetch=AUTOTUNE, deterministic=False)
                        searched[reads] = rate(config, f"reads-{reads}")
                    best_reads = max(searched, key=searched.get)
                    best = max(searched[best_reads], seed_rate)
                    rows.append({"storage": label, "format": fmt, "seed": seed_rate, "fix": fix_rate,
                                 "best": best, "best_reads": best_reads, "fix_over_best": fix_rate / best,
                                 "fix_config": fix.config_changes if fix else {},
                                 "tried": len(fix.trials) if fix else 0})
                    # every listed fix: its predicted gain against its measured one, each applied as it was
                    # priced, beside the advice the model does not cover (the shuffle's place)
                    listed = found["diagnosis"].advice
                    unpriced = [a for a in listed if a.knobs and a.gain_basis.startswith("not predicted")]
                    base = apply_advice(seed, unpriced) if unpriced else seed
                    base_rate = rate(base, "unpriced") if unpriced else seed_rate
                    for advice in listed:
                        if not advice.knobs or advice.predicted_gain is None:
                            continue
                        alone = rate(apply_advice(base, advice), f"alone-{advice.key}")
                        gains.append({"storage": label, "format": fmt, "fix": advice.key,
                                      "predicted_gain": advice.predicted_gain,
                                      "measured_gain": alone / base_rate - 1.0})
                    # tuned, as train reads this storage; and the healthy variant: tuned feeding a device it keeps up with
                    tuned = tuned_for_source(get_preset("tuned"), open_source(fmt, path))
                    tuned_rate = rate(tuned, "tuned")
                    healthy = diagnose_fix(fmt, path, get_preset("tuned"), accelerator=args.healthy_accelerator,
                                           fixed=run / "tuned-fixed.json")["diagnosis"]
                    if kind == "local":
                        tuned_local[fmt] = tuned_rate
                    tuned_rows.append({"storage": label, "format": fmt, "tuned": tuned_rate,
                                       "verdict": healthy.verdict, "fixes": [a.key for a in healthy.advice if a.knobs],
                                       "ceiling": ceiling, "tuned_local": tuned_local.get(fmt)})

    print(f"advice benchmark: {args.images_per_class * 10} JPEGs, {args.accelerator}, {args.steps} steps a config, "
          f"{cores} cores; images/s")
    print(f"  {'storage':<12}{'format':<9}{'seed':>8}{'fix':>8}{'best':>8}  {'fix/best':>8}  best by hand     fix")
    for r in rows:
        knobs = ", ".join(f"{k}={v}" for k, v in r["fix_config"].items()
                          if k in ("read_parallelism", "private_threadpool_size", "cache", "map_parallelism"))
        print(f"  {r['storage']:<12}{r['format']:<9}{r['seed']:>8,.0f}{r['fix']:>8,.0f}{r['best']:>8,.0f}  "
              f"{r['fix_over_best']:>7.2f}x  {r['best_reads']:>3} in flight     {knobs} ({r['tried']} tried)")
    print("each listed fix (beside the unpriced ones, as priced): predicted vs measured gain (target: measured >= "
          "half the predicted)")
    for g in gains:
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
    if args.json:
        args.json.write_text(json.dumps({"cells": rows, "gains": gains, "tuned": tuned_rows}, indent=2))


if __name__ == "__main__":
    main()
