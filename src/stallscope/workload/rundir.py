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
  .stallscope-run.json  {"written": [names]}: the files stallscope wrote here. A run refuses a folder
                      where it would replace a file this record does not name, or write through a
                      symlink (stallscope makes none); run files are written whole, by rename.
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
  null, cold {applied, files, bytes, how} or null, split_coverage {images_trained, images_in_split,
  dropped, why_dropped} (the last three null where nothing is set against the split: a run by steps or
  to a precision, a resumed or interrupted one),
  run_dir, started_at, wall_time_s, interrupted, stallscope_version, tensorflow_version,
  python_version. "Per image" is per image trained: what was fetched, read-ahead abandoned at the
  end included, over the images the steps took."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Any

from stallscope.errors import DataError, UsageError

SUMMARY_NAME = "summary.json"
STEPS_NAME = "steps.csv"
PIPELINE_NAME = "pipeline.json"
RESOURCES_NAME = "resources.json"
PROFILE_DIR = Path("plugins") / "profile"
MONITOR_PROFILE_DIR = "profile"  # StallMonitor's LOG_DIR/profile/, which holds its PROFILE_DIR
OWNED_NAME = ".stallscope-run.json"  # {"written": [names of the files stallscope wrote in this folder]}
RUN_FILES = (STEPS_NAME, PIPELINE_NAME, RESOURCES_NAME, SUMMARY_NAME)  # what `train` writes by name
RUN_FOLDERS = ("train", str(PROFILE_DIR.parent))  # what `train` writes into (new files, by TF)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """Wall-clock timing of one training step, measured on every run (not only when profiling)."""

    step: int             # global step, 1-based, continues across resumes
    phase: str            # "train", or the fine-tuning phase ("head", "full", ...)
    started_s: float      # seconds since the run started
    step_ms: float        # the whole step: waiting for the batch plus the model step
    input_wait_ms: float  # time blocked in the iterator's get_next
    compute_ms: float     # the model step (or the emulated accelerator's wait)
    images: int | None    # images in the batch; None (an empty cell): not known
    warmup: bool          # excluded from means (tracing, first fill of buffers)
    minor_faults: int | None = None  # this process's minor page faults during the step (None: not counted)
    requests: int | None = None  # requests during the step, by the run's io basis (step_io.py); None: not counted
    bytes_read: int | None = None  # bytes fetched during the step, by the same basis


def write_steps(run_dir: Path, steps: list[StepRecord]) -> None:
    fields = [f.name for f in dataclasses.fields(StepRecord)]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    for record in steps:
        writer.writerow(dataclasses.asdict(record))
    _write_owned(Path(run_dir), STEPS_NAME, text.getvalue())


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
                    compute_ms=float(row["compute_ms"]),
                    images=int(row["images"]) if row["images"] else None,  # empty: not known (StallMonitor)
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


def written_by_us(run_dir: Path) -> set[str] | None:
    """The names the folder's record says stallscope wrote there; None where it has no record (a fresh
    folder, or one written before the record existed)."""
    path = Path(run_dir) / OWNED_NAME
    if path.is_symlink():
        return set()  # a record stallscope did not make vouches for nothing (foreign_file names it)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return set()
    names = data.get("written") if isinstance(data, dict) else None
    return {name for name in names if isinstance(name, str)} if isinstance(names, list) else set()


def _looks_like_ours(path: Path, name: str) -> bool:
    """A folder without a record (written by an earlier stallscope): our files start as ours do."""
    try:
        with open(path, encoding="utf-8") as handle:
            if name == STEPS_NAME:
                return tuple(handle.readline().strip().split(","))[:len(_STEPS_HEADER)] == _STEPS_HEADER
            data = json.load(handle)
            return isinstance(data, dict) and any(key in data for key in _JSON_KEYS.get(name, ()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def foreign_file(run_dir: Path, names: tuple[str, ...] = (STEPS_NAME, RESOURCES_NAME, PIPELINE_NAME)) -> Path | None:
    """The first of `names` in `run_dir` that stallscope did not write: one its record does not name (or,
    without a record, one that does not start as ours does), or any symlink, as stallscope makes none. A
    run writing there would replace a file of the user's, or write through the link."""
    if (Path(run_dir) / OWNED_NAME).is_symlink():
        return Path(run_dir) / OWNED_NAME  # the record itself: never written through
    ours = written_by_us(run_dir)
    for name in names:
        path = Path(run_dir) / name
        if path.is_symlink():
            return path
        if not path.exists():
            continue
        if not path.is_file() or (name not in ours if ours is not None else not _looks_like_ours(path, name)):
            return path
    return None


def claim_run_dir(run_dir: Path, *, flag: str, files: tuple[str, ...] = RUN_FILES,
                  folders: tuple[str, ...] = RUN_FOLDERS) -> None:
    """Refuses, before any work, a folder where a run would replace a file stallscope did not write or
    write through a link it did not make (a resumed or repeated run into its own folder passes)."""
    run_dir = Path(run_dir)
    foreign = foreign_file(run_dir, files)
    if foreign is None:
        foreign = next((run_dir / name for name in folders if (run_dir / name).is_symlink()), None)
    if foreign is None:
        return
    what = "a symlink stallscope did not make" if foreign.is_symlink() else "not written by stallscope"
    raise UsageError(f"{flag}: {str(run_dir)!r} holds {foreign.name!r}, {what}, which a run would replace; "
                     "expected a new folder or one of stallscope's own runs (move the file or pick another folder)")


def _write_owned(run_dir: Path, name: str, text: str) -> None:
    """Writes `name` whole, under a temporary name made here (never through a link), renamed over it; the
    folder's record names it first, so a later run knows the file as ours. A file of the user's there is
    refused, not replaced."""
    path = run_dir / name
    if foreign_file(run_dir, (name,)) is not None:
        claim_run_dir(run_dir, flag="run folder", files=(name,), folders=())
    tmp = run_dir / f".{name}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        _record_written(run_dir, name)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _record_written(run_dir: Path, name: str) -> None:
    ours = written_by_us(run_dir)
    if ours is None:  # the first record of a folder an earlier stallscope wrote: its files stay ours
        ours = {known for known in RUN_FILES if (run_dir / known).is_file() and not (run_dir / known).is_symlink()
                and _looks_like_ours(run_dir / known, known)}
    elif name in ours:
        return
    record = run_dir / OWNED_NAME
    tmp = run_dir / f".{OWNED_NAME}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"written": sorted(ours | {name})}, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, record)


def write_json(run_dir: Path, name: str, data: Any) -> None:
    _write_owned(Path(run_dir), name, json.dumps(data, indent=2, ensure_ascii=True) + "\n")


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
