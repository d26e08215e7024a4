"""Benchmark: what `diagnose` costs and what its fix gains, on the built-in data set.

In one run, against an emulated 2,000 images/s device:
- the probes' wall time of `diagnose` (target: under 60 s) for the `seed` pipeline from JPEG files,
  from TFRecords, and for `tuned`, with its ratio to one plain training epoch of the same workload
  measured here (how many epochs a diagnosis costs);
- I/O per image (read calls, files opened) from files vs records: seed-002's question;
- `--fix` on `seed`: images/s before and after, and the ratio.

usage: python benchmarks/diagnose.py [--data DIR] [--accelerator emulated:2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def prepare(data: Path | None, scratch: Path) -> tuple[Path, Path]:
    """(image tree, records dir) of the built-in data set, made here unless --data names a tree."""
    from stallscope.cli.main import main
    from stallscope.data.synthetic import SyntheticOptions, make_synthetic

    tree = data
    if tree is None:
        tree = scratch / "synthetic"
        make_synthetic(tree, SyntheticOptions())
    records = scratch / "records"
    if main(["convert", "--dataset-path", str(tree), "--output-path", str(records)]) != 0:
        raise SystemExit("convert failed")
    return tree, records


def epoch_seconds(train_options) -> float:
    """Wall time of one plain training epoch of the workload: the baseline of the probes' cost."""
    import dataclasses

    from stallscope.workload.train import run_training

    with tempfile.TemporaryDirectory() as run_dir:
        started = time.perf_counter()
        run_training(dataclasses.replace(train_options, steps=None, epochs=1, log_path=Path(run_dir)))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="an image tree with a train split")
    parser.add_argument("--accelerator", default="emulated:2000")
    args = parser.parse_args()

    from stallscope.analysis.differential import DiagnoseOptions, diagnose
    from stallscope.analysis.fix_loop import fix
    from stallscope.pipeline.presets import get_preset
    from stallscope.tfimport import import_tensorflow
    from stallscope.workload.train import TrainOptions

    import_tensorflow()
    with tempfile.TemporaryDirectory() as scratch:
        tree, records = prepare(args.data, Path(scratch))
        cases = [("seed", "files", tree), ("seed", "records", records), ("tuned", "files", tree)]
        print(f"{'pipeline':10}{'source':9}{'probes s':>9}{'epoch s':>9}{'ratio':>7}{'share':>8}"
              f"{'cause':>15}{'reads/img':>10}{'files/img':>10}")
        diagnoses = {}
        for preset, kind, path in cases:
            train = TrainOptions(source=kind, dataset_path=path, pipeline=get_preset(preset),
                                 accelerator=args.accelerator)
            options = DiagnoseOptions(train=train)
            result = diagnose(options)
            diagnoses[(preset, kind)] = (options, result)
            baseline = epoch_seconds(train)
            io = result.cold.io_per_image if result.cold else result.warm.io_per_image
            print(f"{preset:10}{kind:9}{result.seconds:9.1f}{baseline:9.1f}{result.seconds / baseline:7.1f}"
                  f"{result.input_share * 100:7.1f}%{result.cause:>15}{io.read_calls:10.2f}{io.files_opened:10.3f}")
        options, result = diagnoses[("seed", "files")]
        started = time.perf_counter()
        fixed = fix(options, result)
        seconds = time.perf_counter() - started
        phase = fixed.phases[0]
        print(f"\n--fix on seed/files ({', '.join(a.key for a in fixed.applied)}), re-run {seconds:.1f} s:")
        print(f"  images/s before {phase.before.images_per_second:,.0f}, predicted "
              f"{phase.predicted.images_per_second:,.0f}, after {phase.after.images_per_second:,.0f} "
              f"(x{phase.after.images_per_second / phase.before.images_per_second:.2f})")
        print(f"  input share before {phase.before.input_share * 100:.1f}%, after {phase.after.input_share * 100:.1f}%")
        slowest = max(r.seconds for _, r in diagnoses.values())
        print(f"\nslowest diagnosis: {slowest:.1f} s (target: under 60 s)")


if __name__ == "__main__":
    main()
