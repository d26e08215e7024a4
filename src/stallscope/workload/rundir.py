"""The layout of a run directory, shared by the workload (writer) and the analysis (reader).

RUN_DIR/
  summary.json        headline figures of the run (written by `workload/train.py`), see below
  steps.csv           one row per step of this session: StepRecord fields (a resumed run starts at
                      the step after its checkpoint; `step` is the global step); `requests` and
                      `bytes_read` are counted on the basis summary.json's step_io names (step_io.py)
  pipeline.json       {"requested": PipelineConfig dict, "written": [stages as built, outermost
                       first], "ran": [stages after TF's static rewrites, outermost first],
                       "preset": name, "overrides": {knob: value changed from the preset}}; for a
                      dataset of the user's (StallMonitor / stallscope.profile / stallscope.diagnose
                      given it): "written", "ran" and "decodes_images" (bool) only
  resources.json      {"interval_s", "duration_s", "cores", "cpu": summary below,
                       "io": /proc/self/io deltas (rchar, wchar, syscr, syscw, read_bytes, write_bytes) or null,
                       "samples": [{"elapsed_s", "process_percent", "system_percent", "per_cpu_percent"}]}
  plugins/profile/*/  TF profile (`*.xplane.pb`) when --profile_steps was given; TensorBoard reads it.
                      Each profiled step is a `Trace('train', step_num=i, _r=1)` around get_next and
                      the model step; an emulated step's wait is a `Trace('emulated_accelerator')`.
  train/              TensorBoard scalars: loss, examples_per_sec, input_wait_ms, step_time_ms
                      (and validation/top1, top5, loss)

A user's own program writes the same files: StallMonitor into LOG_DIR (its profile under
LOG_DIR/profile/plugins/profile/; under Keras' steps_per_execution a step's `step` is its first batch,
and an earlier fit of a reused monitor moves to LOG_DIR/fit-K/), stallscope.profile into LOG_DIR and a
copy of resources.json and pipeline.json into its own capture folder, so each window reads its own.

summary.json keys (numbers stay numbers; times in ms are means over non-warm-up steps):
  images_per_second, step_time_ms, input_wait_ms, compute_ms, input_share (0..1), verdict,
  step_time_p50_ms, step_time_p90_ms, step_time_std_ms, input_wait_p50_ms, input_wait_p90_ms,
  minor_faults_per_image (minor page faults of the process per image, measured steps) or null, steps, warmup_steps, measured_steps, images, first_step, last_step, resumed_from_step,
  resumed_data {epoch, skipped_examples, exact} or null (not resumed), total_steps, epochs,
  epochs_started, batch_size, image_size, final_loss, mean_loss_last_10, train_top1_last_10 (training-mode
  accuracy of the last 10 batches) or null, batchnorm {mode, default, layers, trained_layers,
  frozen_layers_calibrated_at_start, recalibrations, recalibration_images} or null (emulated),
  pipeline {preset, requested, overrides, written, ran}, model {model, alpha, weights, fine_tune, ...} or
  null (emulated), source {kind, path, split, examples, files, bytes, schema, classes},
  accelerator {kind, spec, images_per_second, ms_per_step}, dataset_path, dataset_size,
  learning_rate, cpu {cores (the CPU the run may use: affinity under the cgroup quota), cpus, quota_cores,
  throttled_s, throttled_share (the quota's cgroup ran out in that share of its periods; null without a quota), samples, process_mean_percent, process_max_percent,
  system_mean_percent, system_max_percent (the two system ones null where the run was too short to
  sample), process_cpu_seconds, duration_s},
  io {rchar, read_bytes, syscr, ..., files_opened, per_image {bytes_read, storage_bytes,
  read_calls, files_opened}} or null, profile {steps, captured_steps, files} or null,
  checkpoint {path, latest} or null, validation {examples, top1, top5, loss, k, ...} or null,
  precision {halves_images_per_second, spread, measured_s, measured_steps, target, reached, stopped_by,
  warning} (workload/precision.py), step_io {basis, meaning} (steps.csv's requests and bytes_read),
  fetched {basis, requests, bytes, images_trained, requests_per_image, bytes_per_image, bytes_trained,
  read_amplification, per_image} or null, store_latency {requests, p50_ms, p90_ms, p99_ms, histogram
  [{up_to_ms, requests}]} or null (data not on the emulator), store_requests (stallscope's reader) or
  null, cold {applied, files, bytes, how} or null,
  run_dir, started_at, wall_time_s, interrupted, stallscope_version, tensorflow_version,
  python_version. "Per image" is per image trained: what was fetched, read-ahead abandoned at the
  end included, over the images the steps took."""

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
MONITOR_PROFILE_DIR = "profile"  # StallMonitor's LOG_DIR/profile/, which holds its PROFILE_DIR


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
    minor_faults: int | None = None  # this process's minor page faults during the step (None: not counted)
    requests: int | None = None  # requests during the step, by the run's io basis (step_io.py); None: not counted
    bytes_read: int | None = None  # bytes fetched during the step, by the same basis


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
                    minor_faults=int(row["minor_faults"]) if row.get("minor_faults") else None,  # older runs: none
                    requests=int(row["requests"]) if row.get("requests") else None,
                    bytes_read=int(row["bytes_read"]) if row.get("bytes_read") else None,
                ))
            except (KeyError, ValueError) as exc:
                raise DataError(f"{path}: malformed row {row} ({exc})") from None
    return records


# What each run file stallscope writes starts with: a file without it is someone else's, never replaced.
_STEPS_HEADER = ("step", "phase", "started_s", "step_ms", "input_wait_ms", "compute_ms", "images", "warmup")
_JSON_KEYS = {RESOURCES_NAME: ("cpu", "samples"), PIPELINE_NAME: ("written", "ran", "requested"),
              SUMMARY_NAME: ("step_time_ms", "input_share")}


def foreign_file(run_dir: Path, names: tuple[str, ...] = (STEPS_NAME, RESOURCES_NAME, PIPELINE_NAME)) -> Path | None:
    """The first of `names` in `run_dir` that stallscope did not write (a steps.csv without its header, a
    JSON file without its keys): a run writing there would replace a file of the user's."""
    for name in names:
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                if name == STEPS_NAME:
                    ours = tuple(handle.readline().strip().split(","))[:len(_STEPS_HEADER)] == _STEPS_HEADER
                else:
                    data = json.load(handle)
                    ours = isinstance(data, dict) and any(key in data for key in _JSON_KEYS[name])
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            ours = False
        if not ours:
            return path
    return None


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
