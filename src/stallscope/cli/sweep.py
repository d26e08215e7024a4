"""Run an experiment grid: formats x stores x latencies x bandwidths x pipelines x accelerators x
learning rates.

Each cell is `stallscope train` with those settings, run --repeats times (each in its own process,
one at a time), each run a normal run directory under SWEEP_DIR/cells/. The sweep writes
results.csv (one row per run: images/s, step time, input share in %, the verdict, the bottleneck
stage from a profile of its last --profile-last steps, requests per image), summary.csv (one row per
cell: medians and a 95% t-interval of the mean over its repeats), results.md (the summary),
TensorBoard HParams (`tensorboard --logdir SWEEP_DIR/hparams`, HParams tab), report.html and its
figures as PNG and PDF in SWEEP_DIR/figures (images/s and input share vs per-request latency on a log
axis, or input share vs accelerator speed with the knee where several speeds are swept).

The `records` format converts the data once into SWEEP_DIR/records, shared by every cell.
--store local reads the folder on local disk; gcs, s3 and mount serve it through the storage
emulator at each --latency per request (and each --bandwidth cap), a fresh store per run; what it
served is kept in each run's storage.json and the tables add requests per image.

Stopped (Ctrl-C, SIGTERM, a crash, a reboot), the same command resumes: complete runs are kept, partial
ones run again. A run ends with its sweep, even one killed by `kill -9`; a resume refuses, naming the
cell and the PID, while the run of a killed sweep is still running. A different grid is refused in the same folder unless --replace-grid says so.
Figures leave out the warm-up and profiled steps of every run.

--precision PCT runs every run as `train --precision` does, until its halves' images/s agree within PCT;
each row of results.csv says the precision its run reached. --cold starts every run as `train --cold`
does (not applicable to gs:// and s3://, which the tables say); cold cells are named apart from warm ones.

examples:
  stallscope sweep --data images --out sweeps/format --format files,records --pipeline seed,tuned \\
      --accelerator emulated:500,emulated:2000 --steps 40 --repeats 3
  stallscope sweep --data images --out sweeps/lr --accelerator real --learning-rate 1e-4,1e-3 --steps 100
  stallscope sweep --data images --out sweeps/storage --format files,records --store local,gcs,s3 \\
      --latency 0ms,10ms,30ms
  stallscope sweep --data images --out sweeps/paper --store local,gcs --latency 10ms --precision 5% --cold
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from stallscope.cli import flags
from stallscope.cli.signals import sigterm_as_interrupt
from stallscope.cli.train import add_knob_flags, knob_overrides, resolve_model_flags
from stallscope.errors import DataError, UsageError
from stallscope.workload.models import MODELS
from stallscope.workload.precision import (DEFAULT_TOLERANCE, SHORT_RUN_S,
                                          PrecisionTarget)

DEFAULT_STEPS = 20
DEFAULT_REPEATS = 3
DEFAULT_PROFILE_LAST = 2
LOCK_NAME = "sweep.lock"


def add_parser(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("data and output")
    flags.add_flag(where, "dataset_path", "--data", type=flags.existing_dir, required=True, metavar="DIR",
                   help="the image tree: {label}/* or {split}/{label}/*")
    flags.add_flag(where, "out", type=flags.creatable_dir, required=True, metavar="SWEEP_DIR",
                   help="the sweep folder: cells, records, table, HParams and report (resumed when it holds this grid)")
    flags.add_flag(where, "split", default="train", help="split to train on (default: train)")
    flags.add_flag(where, "shards", type=flags.positive_int, default=None, metavar="N",
                   help="shards per split for the records format (default: convert's, 50 MiB per shard)")
    flags.add_flag(where, "against", type=flags.existing_dir, default=None, metavar="EARLIER_SWEEP_DIR",
                   help="an earlier sweep of the same grid: say which cells agree with it (the 95%% interval of the "
                        "difference of their means holds 0) and which medians fall inside its 95%% intervals "
                        "(rerun.csv, the table and a line in results.md)")
    flags.add_flag(where, "replace_grid", action="store_true",
                   help="SWEEP_DIR holds another grid: run this one there (its cells with the same settings are kept)")
    axes = parser.add_argument_group("axes (comma-separated values; every combination is a cell)")
    flags.add_flag(axes, "format", default="files", metavar="files,records", help="data formats (default: files)")
    flags.add_flag(axes, "store", default=None, metavar="local,gcs,s3,mount",
                   help="where the data is read from: local (the folder on local disk), or an emulated gs://, s3:// "
                        "store or FUSE mount serving it (default: local, and gcs where --latency names a latency)")
    flags.add_flag(axes, "latency", default="local", metavar="0ms,10ms,30ms",
                   help="the emulated stores' delay per request (a bare number is ms); local among them adds the "
                        "local store (default: local)")
    flags.add_flag(axes, "bandwidth", default=None, metavar="200Mbit,1Gbit",
                   help="the emulated stores' shared bandwidth caps, e.g. 200Mbit; none: no cap (default: none)")
    flags.add_flag(axes, "pipeline", default="tuned", metavar="seed,tuned",
                   help="pipeline presets (seed, autotune, tuned; default: tuned); knob flags below apply to each")
    flags.add_flag(axes, "accelerator", default="real", metavar="emulated:500,emulated:2000",
                   help="real, emulated:IMAGES_PER_SECOND or emulated:MSms (default: real)")
    flags.add_flag(axes, "learning_rate", "--lr", default="0.0001", metavar="1e-4,1e-3",
                   help="Adam learning rates, as seed-003 sweeps them (default: 1e-4)")
    runs = parser.add_argument_group("runs")
    flags.add_flag(runs, "steps", type=flags.positive_int, default=None, metavar="N",
                   help=f"steps per run (default: {DEFAULT_STEPS}; not with --precision)")
    flags.add_precision_flags(runs, each="each run", instead="--steps",
                              reported="every run's row carries the precision it reached")
    flags.add_flag(runs, "cold", action="store_true",
                   help="start every run cold, as `train --cold` does: the data's files evicted from the page cache "
                        "(local disk; a FUSE mount's kernel cache, the emulated store being fresh per run anyway); "
                        "not applicable to gs:// and s3://, which the tables say. Cold cells are named apart from "
                        "warm ones, so a resumed sweep never mixes them")
    flags.add_flag(runs, "repeats", type=flags.positive_int, default=DEFAULT_REPEATS, metavar="N",
                   help=f"runs per cell; the table shows their medians (default: {DEFAULT_REPEATS})")
    flags.add_flag(runs, "warmup_steps", type=flags.non_negative_int, default=2, metavar="N",
                   help="first steps of each run left out of the figures (default: 2)")
    flags.add_flag(runs, "profile_last", type=flags.non_negative_int, default=DEFAULT_PROFILE_LAST, metavar="N",
                   help="profile each run's last N steps to name the bottleneck stage; they are left out of the "
                        f"figures; 0: no profile, no bottleneck (default: {DEFAULT_PROFILE_LAST})")
    flags.add_flag(runs, "run_timeout", type=flags.duration, default=None, metavar="DURATION",
                   help="stop a run that takes longer (it counts as failed and runs again on resume; default: none)")
    model = parser.add_argument_group("model (with --accelerator real)")
    flags.add_flag(model, "model", choices=sorted(MODELS), default=None, help="keras.applications base (default: mobilenet)")
    flags.add_flag(model, "alpha", type=flags.positive_float, default=1.0, help="MobileNet width multiplier (default: 1.0)")
    flags.add_flag(model, "weights", default=None, metavar="none|imagenet|PATH", help="base weights (default: none)")
    flags.add_flag(model, "fine_tune", default="head", metavar="head|full|last:N", help="what trains (default: head)")
    add_knob_flags(parser.add_argument_group("pipeline knobs (override every preset of --pipeline)"))


def build_grid(args: argparse.Namespace):
    """The Grid the flags describe; every bad value is one line naming its flag."""
    from stallscope.pipeline.presets import apply_overrides, get_preset
    from stallscope.sweep.grid import Axes, Grid

    axes = Axes.parse(formats=args.format, stores=args.store, latencies=args.latency, bandwidths=args.bandwidth,
                      pipelines=args.pipeline, accelerators=args.accelerator, learning_rates=args.learning_rate)
    knobs = knob_overrides(args)
    for preset in axes.pipelines:
        apply_overrides(get_preset(preset), knobs)  # a knob a preset cannot take fails now, not in a cell
    precision = _precision_target(args)
    steps = args.steps if args.steps is not None or precision is not None else DEFAULT_STEPS
    least = args.warmup_steps + args.profile_last + 2
    if steps is not None and steps < least:
        raise UsageError(f"--steps: expected at least {least} (--warmup-steps {args.warmup_steps} + --profile-last "
                         f"{args.profile_last} + 2 measured), got {steps}")
    model, weights = resolve_model_flags(args.model, None, args.weights)
    shared: dict[str, Any] = {
        "dataset_path": str(Path(args.dataset_path).resolve()), "split": args.split, "steps": steps,
        "warmup_steps": args.warmup_steps, "profile_last": args.profile_last, "knobs": knobs, "model": model,
        "alpha": args.alpha, "weights": weights, "fine_tune": args.fine_tune, "shards": args.shards,
    }
    if precision is not None:  # only where asked: a grid saved before these flags still matches
        shared["precision"] = precision.to_dict()
    if args.cold:
        shared["cold"] = True
    return Grid(axes=axes, repeats=args.repeats, shared=json.loads(json.dumps(shared)))


def _precision_target(args: argparse.Namespace) -> PrecisionTarget | None:
    """The workload's own PrecisionTarget every run measures to; refused beside --steps as train refuses it."""
    if args.precision is None:
        return None
    if args.steps is not None:
        raise UsageError("--precision: runs until its figure is that precise; --steps fixes the length "
                         "instead: give one of them")
    if args.max_seconds < args.min_seconds:
        raise UsageError(f"--max-seconds: expected at least --min-seconds ({args.min_seconds:g}s), "
                         f"got {args.max_seconds:g}s")
    return PrecisionTarget(args.precision, args.min_seconds, args.max_seconds)


def _check_folder(out: Path, grid, replace: bool) -> None:
    """A new folder, an empty one, or one of our sweeps holding this grid (or --replace-grid)."""
    from stallscope.sweep.grid import differences
    from stallscope.sweep.runner import GRID_NAME

    saved_path = out / GRID_NAME
    if not saved_path.exists():
        others = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME) if out.exists() else []
        if others:
            raise UsageError(f"--out: expected a new folder or a sweep folder, got {str(out)!r} holding "
                             f"{', '.join(others[:3])}{' ...' if len(others) > 3 else ''} and no {GRID_NAME}")
        return
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{saved_path}: not a readable sweep grid ({exc}); expected the sweep.json a sweep wrote")
    changed = differences(saved, grid.to_dict())
    if changed and not replace:
        raise UsageError(f"--out: {str(out)!r} holds another grid ({'; '.join(changed)}); expected the same flags "
                         f"to resume it, or --replace-grid to run this grid there")


def _convert_records(args: argparse.Namespace, out: Path) -> Path:
    from stallscope.records.convert import ConvertOptions, convert_tree
    from stallscope.sweep.runner import RECORDS_DIR

    report = convert_tree(ConvertOptions(dataset_path=args.dataset_path, output_path=out / RECORDS_DIR,
                                         shards=args.shards))
    reused = f", {report.reused_shards} reused" if report.reused_shards else ""
    print(f"records: {report.examples} images in {report.shards} shard(s) in {report.output_path}{reused}", flush=True)
    return report.output_path


def resume_command(grid, out: Path) -> str:
    """The command line that runs (or resumes) this grid."""
    axes, shared = grid.axes, grid.shared
    words = ["stallscope", "sweep", "--data", shared["dataset_path"], "--out", str(out),
             "--format", ",".join(axes.formats), "--store", ",".join(axes.stores),
             "--latency", ",".join(axes.latencies) or "local",
             "--pipeline", ",".join(axes.pipelines), "--accelerator", ",".join(axes.accelerators),
             "--learning-rate", ",".join(f"{v:g}" for v in axes.learning_rates)]
    precision = shared.get("precision")
    if precision:
        words += ["--precision", f"{precision['tolerance'] * 100:g}%", "--min-seconds",
                  f"{precision['min_seconds']:g}s", "--max-seconds", f"{precision['max_seconds']:g}s"]
    else:
        words += ["--steps", str(shared["steps"])]
    words += ["--repeats", str(grid.repeats)]
    if shared.get("cold"):
        words.append("--cold")
    for flag, key, default in (("--warmup-steps", "warmup_steps", 2), ("--profile-last", "profile_last",
                                DEFAULT_PROFILE_LAST), ("--split", "split", "train"), ("--shards", "shards", None)):
        if shared[key] != default:
            words += [flag, str(shared[key])]
    for flag, key, default in (("--model", "model", "mobilenet"), ("--alpha", "alpha", 1.0),
                               ("--weights", "weights", "none"), ("--fine-tune", "fine_tune", "head")):
        if shared[key] != default:
            words += [flag, str(shared[key])]
    if axes.bandwidths != (None,):
        from stallscope.sweep.figures import bandwidth_name

        words += ["--bandwidth", ",".join(bandwidth_name(b) if b else "none" for b in axes.bandwidths)]
    for knob, value in shared["knobs"].items():
        words += [f"--{knob.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value)]
    return shlex.join(words)


def run_notes(grid) -> list[str]:
    """What each run was: its length, the steps its figures leave out, and whether it started cold."""
    shared = grid.shared
    precision = shared.get("precision")
    if precision:
        length = (f"until its halves' images/s agree within {precision['tolerance']:.0%} (`train --precision`), "
                  f"after {precision['min_seconds']:g} s measured, at most {precision['max_seconds']:g} s; the first "
                  f"{shared['warmup_steps']} (warm-up) and the {shared['profile_last']} after them (profiled) steps "
                  "left out of its figures and its precision")
    else:
        length = (f"{shared['steps']} steps, the first {shared['warmup_steps']} (warm-up) and the last "
                  f"{shared['profile_last']} (profiled) left out of its figures")
    notes = [f"each run: {length}",
             "bottleneck: the tf.data stage a profile of each run's profiled steps names, where the run's measured "
             "steps are input-bound",
             "precision: how far apart the images/s of each run's two halves of measured time are (the worst run "
             "of a cell shown)"]
    if shared.get("cold"):
        notes.append("cold: every run started with the data's files evicted from the page cache (`train --cold`); "
                     "not applicable to gs:// and s3:// cells, whose readers keep what they read in the run's process "
                     "only, so they start cold anyway")
    return notes


def precision_notes(results, precision: dict | None) -> list[str]:
    """A warning per run that did not reach the --precision asked for; without one, a count of the runs
    too short to trust."""
    runs = [(result.cell, run) for result in results for run in result.runs]
    if precision:
        return [f"warning: {cell.name} repeat {run.repeat}: {run.precision_warning}"
                for cell, run in runs if run.precision_warning]
    short = sum(1 for _, run in runs if run.precision_warning)
    return [f"warning: {short} of {len(runs)} run(s) too short to trust (under {SHORT_RUN_S:g} s measured, or "
            f"halves more than {DEFAULT_TOLERANCE:.0%} apart); --precision 5% runs each until its halves agree "
            "within 5%"] if short else []


def run(args: argparse.Namespace) -> int:
    from stallscope.records.lock import exclusive_lock
    from stallscope.records.manifest import write_json_atomic
    from stallscope.report.sweep import write_sweep_report
    from stallscope.sweep.hparams import write_hparams
    from stallscope.sweep.rerun import RERUN_NAME, compare, rerun_summary, rerun_table, summary_path, write_rerun_csv
    from stallscope.sweep.results import sweep_results
    from stallscope.sweep.runner import GRID_NAME, Sweep, refuse_while_a_run_lives
    from stallscope.sweep.storage import require_emulator
    from stallscope.tfimport import import_tensorflow
    from stallscope.sweep.table import (CSV_NAME, MARKDOWN_NAME, SUMMARY_NAME, markdown_table, pooling_note,
                                        write_csv, write_markdown, write_summary_csv)

    grid = build_grid(args)
    for store in grid.axes.emulated:
        require_emulator(grid.axes.latencies, store)
    out = Path(args.out)
    if out.resolve().is_relative_to(Path(args.dataset_path).resolve()):
        raise UsageError(f"--out: expected a folder outside --data {str(args.dataset_path)!r} (its runs and records "
                         f"would be read as images), got {str(out)!r}")
    earlier = summary_path(args.against) if args.against is not None else None
    if earlier is not None and Path(args.against).resolve() == out.resolve():
        raise UsageError(f"--against: expected an earlier sweep's folder, got --out {str(out)!r} itself")
    command = resume_command(grid, out)
    _check_folder(out, grid, args.replace_grid)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out / LOCK_NAME, what=f"another `stallscope sweep` into {str(out)!r}"):
        _check_folder(out, grid, args.replace_grid)  # again: the holder of the lock may have written it
        refuse_while_a_run_lives(out)  # a killed sweep's run, still writing what it measured
        write_json_atomic(out / GRID_NAME, grid.to_dict())
        try:
            with sigterm_as_interrupt():  # the train process is stopped by its PID, the resume command printed
                records = _convert_records(args, out) if "records" in grid.axes.formats else None
                sweep = Sweep(grid, out, records_path=records, run_timeout_s=args.run_timeout,
                              on_event=lambda line: print(line, flush=True))
                outcomes = sweep.run()
        except KeyboardInterrupt:
            print(f"stallscope sweep: stopped; complete runs are kept, run the same command to resume:\n  {command}",
                  file=sys.stderr)
            raise
        # The table and HParams read and write TF event files: TensorFlow loads here, in this process,
        # quietly (a plain import printed its absl and oneDNN start-up lines under the sweep's output).
        import_tensorflow()
        results = sweep_results(out, grid)
        notes = run_notes(grid) + precision_notes(results, grid.shared.get("precision"))
        pooling = pooling_note(results)
        if pooling:
            notes.append(pooling)
        if len(grid.axes.accelerators) > 1:
            notes.append("accelerator speed on the input-share plot: an emulated device's set speed, a real one's "
                         "batch / median compute time per step")
        if grid.axes.emulated:
            notes.append(f"stores other than local disk: the storage emulator ({', '.join(grid.axes.emulated)}) "
                         "serving the same data at the latency added per request, a fresh store per run; "
                         "requests/image: what it served over the whole run (listing and read-ahead included) / "
                         "images trained")
        write_csv(out / CSV_NAME, results)
        write_summary_csv(out / SUMMARY_NAME, results)
        rerun = rerun_line = None
        if earlier is not None:
            rerun, missing = compare(earlier, out / SUMMARY_NAME)
            write_rerun_csv(out / RERUN_NAME, rerun)
            rerun_line = rerun_summary(rerun, args.against, missing)
            notes.append(rerun_line)
        write_markdown(out / MARKDOWN_NAME, results, title="stallscope sweep", notes=notes)
        hparams = write_hparams(out, grid, results)
        report = write_sweep_report(out, results, repeats=grid.repeats, steps=grid.shared["steps"], command=command,
                                    notes=notes)
    ran = sum(1 for o in outcomes if o.ran)
    failed = [o for o in outcomes if o.failure]
    print("\n".join(markdown_table(results)))
    if rerun is not None:
        print("\n".join(rerun_table(rerun)))
        print(rerun_line)
    print(f"runs: {ran} ran, {len(outcomes) - ran} already complete, {len(failed)} failed")
    print(f"table    {out / CSV_NAME} (per run)  {out / SUMMARY_NAME} (per cell)  {out / MARKDOWN_NAME}"
          + (f"  {out / RERUN_NAME} (against {args.against})" if rerun is not None else ""))
    print(f"report   {report}  (figures as PNG and PDF in {report.parent / 'figures'})")
    print(f"hparams  tensorboard --logdir {shlex.quote(str(hparams))}  (HParams tab)")
    if failed:
        print(f"stallscope sweep: {len(failed)} run(s) failed (see their logs); run the same command to retry them",
              file=sys.stderr)
        return 1
    return 0
