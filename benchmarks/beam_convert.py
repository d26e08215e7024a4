"""What `convert --runner beam` costs on Beam's local runner against the local convert, in one run.

Builds the built-in data set at two sizes, times each variant in a fresh child process (imports done
before the clock starts; the pipeline's own start-up inside it), and prints images/s, the marginal
milliseconds per image (from the two sizes, so start-up cancels out), the start-up that is left, and
ratios against the local convert measured in the same run. Page cache warm.

Variants:
  local         convert_tree, the local convert: the cores + 1 worker processes
  local-1       the same with one worker process: the per-image cost on one core
  beam-1        convert_with_beam on FnApiRunner (what DirectRunner runs batch jobs on), one worker
                thread in this process
  beam-mp       the same with --direct_running_mode=multi_processing and one worker per core

  python benchmarks/beam_convert.py [--classes 10 --images-per-class 200 --shards 16 --repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from stallscope.config import usable_cores  # noqa: E402

VARIANTS = ("local", "local-1", "beam-1", "beam-mp")


def child(args: argparse.Namespace) -> None:
    from stallscope.records.beam_convert import DEFAULT_RUNNER, convert_with_beam, require_beam
    from stallscope.records.convert import ConvertOptions, convert_tree

    require_beam()
    src, out = Path(args.src), Path(args.out)
    for path in sorted(src.rglob("*.jpg")):  # warm
        path.read_bytes()
    options = ConvertOptions(src, out, shards=args.shards)
    runner = f"--runner={DEFAULT_RUNNER}"
    started = time.perf_counter()
    if args.variant == "local":
        convert_tree(options)
    elif args.variant == "local-1":
        convert_tree(dataclasses.replace(options, workers=1))
    elif args.variant == "beam-1":
        convert_with_beam(options, (runner, "--direct_num_workers=1", "--direct_running_mode=in_memory"))
    else:
        convert_with_beam(options, (runner, f"--direct_num_workers={usable_cores()}", "--direct_running_mode=multi_processing"))
    print(json.dumps({"seconds": time.perf_counter() - started}))


def build_dataset(root: Path, classes: int, per_class: int) -> Path:
    from stallscope.data.synthetic import SyntheticOptions, make_synthetic

    if not root.is_dir():
        make_synthetic(root, SyntheticOptions(classes=classes, images_per_class=per_class, seed=0))
    return root


def time_variant(variant: str, src: Path, work: Path, shards: int) -> float:
    out = work / f"out-{variant}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, __file__, "--child", variant, "--src", str(src), "--out", str(out), "--shards", str(shards)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"{variant} failed:\n{result.stderr}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--images-per-class", type=int, default=200)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", default="bench-output/beam_convert")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", choices=VARIANTS, dest="variant", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        child(args)
        return

    work = Path(args.work)
    big_n, small_n = args.images_per_class, max(1, args.images_per_class // 4)
    trees = {n: build_dataset(work / f"dataset-{args.classes}x{n}", args.classes, n) for n in (small_n, big_n)}
    files = sorted(trees[big_n].rglob("*.jpg"))
    n_big, mean_kb = len(files), sum(p.stat().st_size for p in files) / len(files) / 1e3
    n_small = len(list(trees[small_n].rglob("*.jpg")))
    print(f"data set: {n_big} and {n_small} JPEGs (mean {mean_kb:.0f} KB), {args.shards} shards per split, "
          f"{usable_cores()} core(s), page cache warm, median of {args.repeats}")
    variants = [v for v in args.variants.split(",") if v]
    rows = {}
    for variant in variants:
        t_big = statistics.median(time_variant(variant, trees[big_n], work, args.shards) for _ in range(args.repeats))
        t_small = statistics.median(time_variant(variant, trees[small_n], work, args.shards) for _ in range(args.repeats))
        per_image = (t_big - t_small) / (n_big - n_small)
        rows[variant] = (t_big, per_image, t_big - per_image * n_big)
    base = rows.get("local")
    print(f"{'variant':<10} {'images/s':>9} {'ms/image':>9} {'start-up s':>11} {'vs local':>9} {'marginal vs local':>18}")
    for variant, (seconds, per_image, startup) in rows.items():
        ratio = base[0] / seconds if base else float("nan")
        marginal = base[1] / per_image if base and per_image > 0 else float("nan")
        print(f"{variant:<10} {n_big / seconds:>9.0f} {per_image * 1e3:>9.3f} {startup:>11.2f} {ratio:>8.2f}x {marginal:>17.2f}x")


if __name__ == "__main__":
    main()
