"""The sweep's table: one row per cell, as CSV (numbers as numbers) and as Markdown (rendered)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from stallscope.sweep.results import CellResult

CSV_NAME = "results.csv"
MARKDOWN_NAME = "results.md"

CSV_FIELDS = ("cell", "format", "latency", "pipeline", "accelerator", "learning_rate", "repeats", "repeats_asked",
              "complete", "images_per_second", "images_per_second_min", "images_per_second_max", "spread",
              "step_time_ms", "input_wait_ms", "compute_ms", "input_share", "verdict", "bottleneck",
              "device_images_per_second", "final_loss", "requests_per_image", "bytes_per_image", "request_ms_median",
              "request_ms_p90", "run_dirs")

MARKDOWN_HEADER = ("format", "latency", "pipeline", "accelerator", "lr", "images/s", "step ms", "input share",
                   "verdict", "bottleneck", "requests/image", "request ms", "spread", "repeats")


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def markdown_cells(result: CellResult) -> list[str]:
    """A row's cells as the Markdown table and the HTML report show them."""
    cell = result.cell
    spread = "-" if result.spread is None else f"{result.spread * 100:.0f}%"
    return [cell.format, cell.latency, cell.pipeline, cell.accelerator, f"{cell.learning_rate:g}",
            _num(result.images_per_second), _num(result.step_time_ms), _share(result.input_share),
            result.verdict or "-", result.bottleneck or "-", _num(result.requests_per_image, 2),
            _num(result.request_ms_median), spread, f"{result.repeats}/{result.repeats_asked}"]


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def write_csv(path: Path, results: list[CellResult]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for result in results:
            row = result.row()
            writer.writerow({name: "" if row[name] is None else row[name] for name in CSV_FIELDS})
    os.replace(temporary, path)


def markdown_table(results: list[CellResult]) -> list[str]:
    lines = ["| " + " | ".join(MARKDOWN_HEADER) + " |", "|" + "---|" * len(MARKDOWN_HEADER)]
    lines += ["| " + " | ".join(markdown_cells(r)) + " |" for r in results]
    return lines


def write_markdown(path: Path, results: list[CellResult], *, title: str, notes: list[str]) -> None:
    body = [f"# {title}", "", "Medians over each cell's repeats; spread = (max - min) / median of images/s.", ""]
    body += markdown_table(results) + [""] + [f"- {note}" for note in notes]
    _atomic_write(path, "\n".join(body).rstrip() + "\n")
