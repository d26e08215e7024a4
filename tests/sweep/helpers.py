"""What the sweep tests share: the tiny runs' knobs, main() with argparse's exits as codes, and the tables."""

from __future__ import annotations

import csv
from pathlib import Path

from stallscope.cli.main import main

# No shuffle: every step decodes its own 4 images (a decoded-image shuffle buffer would let a 2-step
# profile window draw from images decoded before it and show no input wait).
TINY_KNOBS = ["--image-size", "32", "--batch-size", "4", "--shuffle-buffer", "0"]


def run_cli(argv: list[str]) -> int:
    """main(), with argparse's own refusals (SystemExit) turned into their exit code."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def csv_rows(out: Path, name: str = "results.csv") -> list[dict[str, str]]:
    """results.csv: one row per run; summary.csv: one per cell."""
    with open(out / name, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def summary_rows(out: Path) -> list[dict[str, str]]:
    return csv_rows(out, "summary.csv")
