"""The layout of a run directory, shared by the workload (writer) and the analysis (reader).

RUN_DIR/
  summary.json        headline figures of the run (see `train.py` for the fields)
  steps.csv           one row per step: StepRecord fields
  pipeline.json       {"requested": PipelineConfig dict, "ran": [stage names, outermost first], ...}
  resources.json      CPU utilisation samples and /proc/self/io counters of the run
  plugins/profile/*/  TF profile (`*.xplane.pb`) when --profile_steps was given; TensorBoard reads it
  train/              TensorBoard scalars
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

from stallscope.errors import DataError
from stallscope.records.manifest import write_json_atomic

SUMMARY_NAME = "summary.json"
STEPS_NAME = "steps.csv"
PIPELINE_NAME = "pipeline.json"
RESOURCES_NAME = "resources.json"
PROFILE_DIR = Path("plugins") / "profile"


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """Wall-clock timing of one training step, measured on every run (not only when profiling)."""

    step: int             # global step, 1-based, continues across resumes
    phase: str            # "train", or the fine-tuning phase ("head", "full", ...)
    started_s: float      # seconds since the run started
    step_ms: float        # the whole step: waiting for the batch plus the model step
    input_wait_ms: float  # time blocked in the iterator's get_next
    compute_ms: float     # the model step (or the emulated accelerator's wait)
    images: int           # images in the batch
    warmup: bool          # excluded from means (tracing, first fill of buffers)


def write_steps(run_dir: Path, steps: list[StepRecord]) -> None:
    path = Path(run_dir) / STEPS_NAME
    fields = [f.name for f in dataclasses.fields(StepRecord)]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for record in steps:
            writer.writerow(dataclasses.asdict(record))


def read_steps(run_dir: Path) -> list[StepRecord]:
    path = Path(run_dir) / STEPS_NAME
    if not path.exists():
        raise DataError(f"{path}: missing; is {str(run_dir)!r} a run directory written by `stallscope train`?")
    records = []
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            try:
                records.append(StepRecord(
                    step=int(row["step"]), phase=row["phase"], started_s=float(row["started_s"]),
                    step_ms=float(row["step_ms"]), input_wait_ms=float(row["input_wait_ms"]),
                    compute_ms=float(row["compute_ms"]), images=int(row["images"]),
                    warmup=row["warmup"] in ("True", "true", "1"),
                ))
            except (KeyError, ValueError) as exc:
                raise DataError(f"{path}: malformed row {row} ({exc})") from None
    return records


def write_json(run_dir: Path, name: str, data: Any) -> None:
    write_json_atomic(Path(run_dir) / name, data)


def read_json(run_dir: Path, name: str) -> dict[str, Any]:
    path = Path(run_dir) / name
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: missing; is {str(run_dir)!r} a run directory written by `stallscope train`?") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None


def profile_files(run_dir: Path) -> list[Path]:
    """The `*.xplane.pb` files of a run, newest capture last."""
    return sorted((Path(run_dir) / PROFILE_DIR).glob("*/*.xplane.pb"))
