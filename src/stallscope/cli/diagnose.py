"""Differential stall analysis: short probes of the workload separate fetch (storage) stalls,
preprocessing (CPU) stalls and compute, per step.

Probes, each a real run of part of the same workload: compute alone (batches already in memory),
the pipeline alone with a cold page cache (the data set's files evicted, no root needed) and with
a warm one, and end to end. The report gives per step the compute, the preprocessing stall and the
fetch stall, I/O per image (bytes read, read calls, files opened), and what-if figures: devices of
other speeds (where the knee is), more CPU cores, the data cached in memory.

Data in gs:// or s3://: no cold-cache probe (the page cache holds nothing of it); the requests,
bytes and request times stallscope's reader made are the storage figures, and the store as read
(its latency from one-byte GETs timed one at a time; for shards, its bandwidth from 4 MiB ranged
GETs, at most 64 MiB) leads the storage what-if and its advice.

--fix applies the advice as a new pipeline config, runs again, prints before / predicted / after
side by side, and saves the config for `stallscope train --pipeline-config FILE`.

examples:
  stallscope diagnose --dataset_path data/train --pipeline seed --accelerator emulated:2000
  stallscope diagnose --source records --dataset_path records --pipeline seed --accelerator emulated:2000 --fix
  stallscope diagnose --dataset_path data --model mobilenet --image_size 128 --phases head,full --json
  stallscope diagnose --dataset-fn my_data.py:make_dataset --model-fn my_model.py:make_model
  stallscope diagnose --dataset_path data --pipeline seed --what-if-storage 10ms,200Mbit --what-if-storage network-fs
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

from stallscope.cli import flags
from stallscope.cli.train import add_pipeline_flags, add_workload_flags, require_data_service, train_options_from_args
from stallscope.errors import UsageError
from stallscope.report.text import fmt_knobs

DEFAULT_FIXED_CONFIG = Path("fixed-pipeline.json")


def _phases(text: str) -> tuple[str, ...]:
    """Comma-separated fine-tuning phases, each as --fine_tune takes it: head, full or last:N."""
    from stallscope.workload.models import parse_fine_tune

    phases = tuple(p.strip() for p in text.split(",") if p.strip())
    if not phases:
        raise argparse.ArgumentTypeError(f"expected phases such as head,full, got {text!r}")
    for phase in phases:
        try:
            parse_fine_tune(phase)
        except UsageError:
            raise argparse.ArgumentTypeError(f"expected phases among head, full and last:N (e.g. head,last:20), "
                                             f"got {phase!r} in {text!r}") from None
    return tuple(parse_fine_tune(phase) for phase in phases)


def _storage_scenarios(text: str):
    """--what-if-storage: LATENCY,BANDWIDTH pairs and preset names, comma-separated."""
    from stallscope.analysis.storage_whatif import parse_scenarios

    try:
        return parse_scenarios(text)
    except (ValueError, UsageError) as exc:
        raise argparse.ArgumentTypeError(f"expected {exc}") from None


def storage_presets_help() -> str:
    from stallscope.analysis.storage_whatif import PRESETS

    return "; ".join(f"{name} = {p.meaning}" for name, p in PRESETS.items())


def add_parser(parser: argparse.ArgumentParser) -> None:
    add_workload_flags(parser)
    probes = parser.add_argument_group("probes")
    flags.add_flag(probes, "probe_steps", type=flags.positive_int, default=20, metavar="N",
                   help="measured steps of the compute and end-to-end probes (default: 20; whole epochs "
                        "on small data sets)")
    flags.add_flag(probes, "pipeline_budget", type=flags.positive_float, default=10.0, metavar="SECONDS",
                   help="most seconds each pipeline-alone probe runs (default: 10)")
    flags.add_flag(probes, "phases", type=_phases, default=None, metavar="PHASE[,PHASE]",
                   help="fine-tuning phases to diagnose one by one, e.g. head,full (default: --fine_tune)")
    flags.add_flag(probes, "no_cold_cache", action="store_true",
                   help="skip the cold-cache probe (leaves the page cache alone)")
    flags.add_flag(probes, "learning_rate", type=flags.positive_float, default=1e-4,
                   help="Adam learning rate of the real model's probe steps (default: 1e-4)")
    flags.add_flag(probes, "warmup_steps", type=flags.non_negative_int, default=2,
                   help="first probe steps left out of the means (tracing; default: 2)")
    flags.add_flag(probes, "work_dir", type=flags.creatable_dir, default=None, metavar="DIR",
                   help="keep the probe runs' directories here, and with --dataset-fn the profile of its end-to-end steps "
                        "(default: a temporary directory, removed; --dataset-fn's profile is kept)")
    storage = parser.add_argument_group("storage what-if")
    flags.add_flag(storage, "what_if_storage", type=_storage_scenarios, action="append", default=None,
                   metavar="LATENCY,BANDWIDTH|PRESET",
                   help="predict files vs records, sequential vs parallel reads on this store, e.g. "
                        "10ms,200Mbit (latency in us/ms/s, bandwidth in Kbit/Mbit/Gbit, MB/s, MiB/s or "
                        "'unlimited'; repeat the flag or list pairs: 10ms,200Mbit,30ms,1Gbit) or a preset: "
                        + storage_presets_help() + ". Storage advice follows where the store dominates. "
                        "Default: the presets are shown, no storage advice")
    flags.add_flag(storage, "storage_client", choices=("tf-gcs", "obstore-gcs", "s3fs", "obstore", "network-fs"),
                   default=None,
                   help="the client the what-if reads a LATENCY,BANDWIDTH store with: network-fs (POSIX opens and "
                        "reads of a network file system: NFS, SMB, a FUSE mount), tf-gcs (TF's gs://, blocks of "
                        "GCS_READ_CACHE_BLOCK_SIZE_MB, default 64, a connection per request), obstore-gcs "
                        "(stallscope's pooled gs:// reader, --gcs-reader pooled), s3fs (pooled connections, "
                        "~2.5 ms of CPU per request) or obstore (~0.25 ms per request) (default: s3:// data's "
                        "reader, obstore where installed; else the pipeline's --gcs-reader)")
    flags.add_flag(storage, "storage_counters", type=flags.existing_file, default=None, metavar="FILE",
                   help='a store\'s counters, {"requests": N, "connections": N, "bytes": N} (written by '
                        "`stallscope storage serve`): requests and connections per image are then measured by "
                        "the store (data read by stallscope's own reader has its requests counted without one)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the diagnosis as JSON (input_share, cause, ...)")
    out.add_argument("--markdown", action="store_true", help="print the diagnosis as Markdown")
    out.add_argument("--fix", action="store_true",
                     help="apply the advice, run again, print before / predicted / after, save the config")
    flags.add_flag(out, "fixed_config", type=flags.creatable_file, default=DEFAULT_FIXED_CONFIG, metavar="FILE",
                   help=f"where --fix saves the fixed pipeline config (default: {DEFAULT_FIXED_CONFIG})")
    own = parser.add_argument_group("your own program (instead of the data and pipeline flags)")
    flags.add_flag(own, "dataset_fn", default=None, metavar="MODULE:FUNCTION",
                   help="a function returning your tf.data.Dataset of (inputs, targets) batches; MODULE is a "
                        "dotted module or a .py file")
    flags.add_flag(own, "model_fn", default=None, metavar="MODULE:FUNCTION",
                   help="a function returning your compiled Keras model, for the compute-alone probe "
                        "(default: --accelerator, emulated:2000 when it is 'real')")
    add_pipeline_flags(parser)


OWN_DATASET_DEFAULT_ACCELERATOR = "emulated:2000"


def _check_overwritable(path: Path) -> None:
    """--fix replaces only a pipeline config (one an earlier --fix saved, or one written by hand), never
    another file the user keeps there (a records folder's manifest.json, notes)."""
    from stallscope.pipeline.config import PipelineConfig

    if not path.exists() and not path.is_symlink():
        return
    try:
        PipelineConfig.load(path)
    except (UsageError, OSError, UnicodeDecodeError):
        raise UsageError(f"--fixed-config: expected a new file or a pipeline config an earlier --fix saved, got "
                         f"{str(path)!r} (it holds something else, which --fix will not overwrite)") from None


def diagnose_own_dataset(args: argparse.Namespace, progress):
    """`--dataset-fn` (and `--model-fn`): the probes on the user's own dataset and model."""
    from stallscope.analysis.dataset_diagnosis import DatasetDiagnoseOptions, diagnose_dataset
    from stallscope.cli.user_code import call_user_function

    if args.json and args.markdown:
        raise UsageError("--markdown: give either --json or --markdown, not both")
    if args.fix:
        raise UsageError("--fix: applies to stallscope's own pipeline only; with --dataset-fn apply the advice "
                         "in your code")
    for flag, value in (("--storage-counters", args.storage_counters),):
        if value is not None:
            raise UsageError(f"{flag}: applies to stallscope's own data source (--dataset-path) only, "
                             "not to --dataset-fn")
    if args.model_fn is None and args.accelerator == "real":
        args.accelerator = OWN_DATASET_DEFAULT_ACCELERATOR
        progress(f"no --model-fn: the compute probe emulates a device ({args.accelerator})")
    dataset = call_user_function(args.dataset_fn, "--dataset-fn")
    model = call_user_function(args.model_fn, "--model-fn") if args.model_fn else None
    options = DatasetDiagnoseOptions(steps=args.probe_steps, accelerator=args.accelerator,
                                     pipeline_budget_s=args.pipeline_budget,
                                     storage_scenarios=tuple(s for group in args.what_if_storage or () for s in group),
                                     storage_client=args.storage_client, work_dir=args.work_dir)
    return diagnose_dataset(dataset, model=model, options=options, progress=progress)


def options_from_args(args: argparse.Namespace):
    from stallscope.analysis.differential import DiagnoseOptions

    if args.json and args.markdown:
        raise UsageError("--markdown: give either --json or --markdown, not both")
    train = train_options_from_args(args)
    return DiagnoseOptions(
        train=train, phases=args.phases or (train.fine_tune,), probe_steps=args.probe_steps,
        pipeline_budget_s=args.pipeline_budget, cold_cache=not args.no_cold_cache, work_dir=args.work_dir,
        storage_scenarios=tuple(s for group in args.what_if_storage or () for s in group),
        storage_client=args.storage_client, storage_counters=args.storage_counters,
    )


def run(args: argparse.Namespace) -> int:
    from stallscope.analysis.differential import diagnose, open_probed_source
    from stallscope.analysis.fix_loop import fix

    quiet = args.json or args.markdown

    def progress(message: str) -> None:
        print(message, file=sys.stderr if quiet else sys.stdout, flush=True)

    if args.dataset_fn is None and args.model_fn is not None:
        raise UsageError("--model-fn: needs --dataset-fn (the model is probed on your own dataset)")
    if args.dataset_fn is not None:
        diagnosis = diagnose_own_dataset(args, progress)
        if args.json:
            sys.stdout.write(json.dumps(diagnosis.to_dict(), indent=2) + "\n")
        elif args.markdown:
            sys.stdout.write("\n".join(markdown_lines(diagnosis)) + "\n")
        else:
            print(diagnosis.text())
        return 0
    options = options_from_args(args)
    if args.fix:  # the default is not checked by argparse; a folder or an unwritable place is found now, not after the probes
        try:
            flags.creatable_file(str(args.fixed_config))
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--fixed-config: {exc}") from None
        _check_overwritable(Path(args.fixed_config))
    require_data_service(options.train.pipeline, args, out=sys.stderr if quiet else sys.stdout)
    source = open_probed_source(options)  # once, for the diagnosis and the fix's re-run
    diagnosis = diagnose(options, progress=progress, source=source)
    result = None
    if args.fix:
        if any(a.knobs for a in diagnosis.advice):
            result = fix(options, diagnosis, save_to=args.fixed_config, progress=progress, source=source)
        else:
            progress(f"--fix: nothing to apply ({diagnosis.verdict} input-bound, no pipeline change advised)")
    if args.json:
        data = diagnosis.to_dict()
        if result is not None:
            data["fix"] = result.to_dict()
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif args.markdown:
        sys.stdout.write("\n".join(markdown_lines(diagnosis, result)) + "\n")
    else:
        print("\n".join(report_lines(diagnosis, result)))
    return 0


def _ms(value: float) -> str:
    return f"{value:.1f} ms"


def _pct(value: float | None) -> str:
    from stallscope.verdict import fmt_share

    return fmt_share(value)


def _rate(value: float) -> str:
    return "unbounded" if math.isinf(value) else f"{value:,.0f} images/s"


def _storage(diagnosis) -> dict:
    return diagnosis.source.get("storage") or {}


def _in_store(diagnosis) -> bool:
    """The data is read from another machine each epoch (a bucket, a network file system)."""
    from stallscope.storage.location import is_remote

    return _storage(diagnosis).get("kind", "local") != "local" or is_remote(str(diagnosis.source.get("path", "")))


def _warm_label(diagnosis) -> str:
    """What the pipeline-alone probe read from: the page cache, or the storage every epoch reads again."""
    if not _in_store(diagnosis):
        return "warm cache"
    return "from the mount" if _storage(diagnosis).get("kind") == "network-fs" else "from the store"


def storage_line(diagnosis) -> str | None:
    """"storage: fuse mount, 20.3 ms per open + read, measured": where the data is and its round trip."""
    storage = _storage(diagnosis)
    if not storage:
        return None
    trip = storage.get("round_trip_ms")
    timed = f", {trip:.1f} ms per {storage['round_trip']}, measured" if trip is not None else ""
    return f"storage: {storage['label']}{timed}"


def _io_rows(diagnosis) -> list[tuple[str, str, str]]:
    """The local I/O per image of each probe (none for data in a store: the reads go over the network,
    where these counters do not see them)."""
    if _in_store(diagnosis):
        return []
    rows = []
    for probe in (diagnosis.cold, diagnosis.warm):
        if probe is None or probe.io_per_image is None:
            continue
        io = probe.io_per_image
        rows.append((f"{probe.cache_state} cache",
                     f"{io.bytes_read / 1024:.1f} KiB read ({io.storage_bytes / 1024:.1f} KiB from storage)",
                     f"{io.read_calls:.2f} read calls, {io.files_opened:.3f} files opened"))
    return rows


def report_lines(diagnosis, result=None) -> list[str]:
    """The terminal report: the split per step, I/O per image, what-ifs, advice, and the fix."""
    source = diagnosis.source
    parts = diagnosis.pipeline_breakdown
    lines = [
        f"diagnosis of {source['kind']} {source['path']} ({source['examples']} examples, "
        f"{source['bytes'] / 1e6:.1f} MB), pipeline {diagnosis.pipeline.preset}, accelerator {diagnosis.accelerator}",
        *([f"reader: {source['reader']}"] if source.get("reader", "TF local files") != "TF local files" else []),
        *([line] if (line := storage_line(diagnosis)) else []),
        f"probes took {diagnosis.seconds:.1f} s",
        "",
        "pipeline alone (per batch of %d)" % diagnosis.pipeline.batch_size,
        f"  {_warm_label(diagnosis):<16}{_ms(parts.warm_ms)}  ({_rate(diagnosis.warm.images_per_second)}; "
        f"{_ms(parts.cpu_ms)} CPU work on {parts.threads:g} core(s), {_ms(parts.waiting_ms)} waiting)",
    ]
    if diagnosis.cold is not None:
        cached = diagnosis.cold.cached_before
        lines.append(f"  cold cache      {_ms(parts.cold_ms)}  ({_rate(diagnosis.cold.images_per_second)}; "
                     f"storage adds {_ms(parts.storage_ms)}"
                     + (f"; {cached * 100:.0f}% of pages cached at start" if cached is not None else "") + ")")
    for label, first, second in _io_rows(diagnosis):
        lines.append(f"  I/O per image, {label}: {first}, {second}")
    for phase in diagnosis.phases:
        lines += [
            "",
            f"phase {phase.phase}: {phase.verdict} input-bound ({_pct(phase.input_share)} of the step waits for input, "
            + (f"reading {_warm_label(diagnosis)}" if _in_store(diagnosis) else f"{phase.steady_cache} page cache")
            + (f"; {_pct(phase.cold_input_share)} with a cold cache" if diagnosis.cold is not None else "")
            + f"), cause: {phase.cause}",
            f"  step            {_ms(phase.step_ms)}  ({_rate(phase.end_to_end.images_per_second)}, "
            f"{'overlapped' if phase.overlapped else 'serial'} input and compute; mean of "
            f"{phase.end_to_end.steps} steps)",
            f"  compute         {_ms(phase.compute_ms)}  (batches from memory)",
            f"  preprocessing   {_ms(phase.preprocessing_stall_ms)}  stall per step (CPU)",
            f"  fetch           {_ms(phase.fetch_stall_ms)}  stall per step (storage, latency"
            + (f"; {_ms(phase.cold_fetch_stall_ms)} with a cold cache)" if diagnosis.cold is not None else ")"),
            f"  knee            input limits any device above {_rate(phase.knee_images_per_second)}; "
            f"highly input-bound above {_rate(phase.highly_bound_above)}",
            "  what if the device ran at:   "
            + ", ".join(f"{d.device_images_per_second:,.0f} -> {_pct(d.prediction.input_share)}"
                        for d in phase.devices),
            f"  what if more CPU cores than the {_cores(phase)} free here, stages parallel and prefetched "
            "(training images/s, input share): "
            + ", ".join(f"+{c.extra_cores} -> {c.prediction.images_per_second:,.0f} ({_pct(c.prediction.input_share)})"
                        for c in phase.cores),
            f"  data cached in memory:       {_ms(phase.cached.step_ms)} step, {_pct(phase.cached.input_share)} input "
            f"({phase.cached_basis if phase.cached_basis != 'measured' else 'measured: the end-to-end run, from the page cache'})"
            + (f"  (from storage: {_ms(phase.from_storage.step_ms)}, {_pct(phase.from_storage.input_share)})"
               if phase.from_storage else ""),
        ]
    if diagnosis.storage is not None or diagnosis.storage_whatif is not None:
        from stallscope.report.text import storage_lines

        lines += ["", *storage_lines(diagnosis.storage, diagnosis.storage_whatif)]
    lines += ["", "advice" if diagnosis.advice else f"advice: {no_advice(diagnosis)}"]
    own_dataset = diagnosis.source.get("kind") == "dataset"  # a dataset of the user's: its code, not our flags
    for number, advice in enumerate(diagnosis.advice, 1):
        knobs = (advice.command if own_dataset else fmt_knobs(advice.knobs) or advice.command)
        lines.append(f"  {number}. {advice.title}" + (f" ({knobs})" if knobs else "") + f"{_gain(advice)}: {advice.reason}")
        if own_dataset:
            lines += [f"     {code}" for code in advice.code.splitlines()]
    lines += [f"note: {note}" for note in diagnosis.notes]
    if result is not None:
        lines += ["", *fix_lines(result)]
    return lines


def _gain(advice) -> str:
    """", +62% predicted": the model's gain of one fix applied alone, where it predicts one."""
    if advice.predicted_gain is not None:
        return f", {advice.predicted_gain:+.0%} predicted"
    return ", gain not predicted" if advice.gain_basis.startswith("not predicted") else ""


def no_advice(diagnosis) -> str:
    """Why there is no advice: the pipeline keeps up, or (input-bound) nothing the model expects to help."""
    if diagnosis.verdict == "not":
        return "none, the pipeline keeps up"
    return (f"none, though {diagnosis.verdict} input-bound: no change the model expects to gain "
            "5% or more (see the what-ifs above)")


def _cores(phase) -> str:
    free = phase.cores[0].cores if phase.cores else 0
    return f"{free:.1f}".rstrip("0").rstrip(".")


def fix_lines(result) -> list[str]:
    lines = [f"fix applied: {', '.join(a.key for a in result.applied)} ({fmt_knobs(result.config_changes)})",
             "predicted: the what-if model above (the same free cores), for the fixed pipeline"]
    header = f"  {'':16}{'before':>12}{'predicted':>12}{'after':>12}"
    for phase in result.phases:
        lines += [
            f"phase {phase.phase}",
            header,
            f"  {'step time':16}{_ms(phase.before.step_ms):>12}{_ms(phase.predicted.step_ms):>12}"
            f"{_ms(phase.after.step_ms):>12}",
            f"  {'input share':16}{_pct(phase.before.input_share):>12}{_pct(phase.predicted.input_share):>12}"
            f"{_pct(phase.after.input_share):>12}",
            f"  {'images/s':16}{phase.before.images_per_second:>12,.0f}{phase.predicted.images_per_second:>12,.0f}"
            f"{phase.after.images_per_second:>12,.0f}",
        ]
    if result.trials:
        lines.append("tried (the advice fell short of its prediction by more than 25%, or stayed input-bound; "
                     "the best measured is kept):")
        best = max(result.trials, key=lambda t: t.images_per_second)
        for trial in result.trials:
            changed = {k: v for k, v in trial.config.to_dict().items()
                       if k in ("read_parallelism", "private_threadpool_size") and v != getattr(result.diagnosis.pipeline, k)}
            predicted = min(p.predicted.images_per_second for p in trial.phases)
            lines.append(f"  {trial.why:<34} {fmt_knobs(changed):<58} predicted {predicted:>7,.0f}  measured "
                         f"{trial.images_per_second:>7,.0f} images/s" + ("  <- kept" if trial is best else ""))
    lines.append("the advice held: the input share went down" if result.held
                 else "the advice did not hold: the input share did not go down in every phase")
    if result.config_path is not None:
        lines.append(f"fixed pipeline saved to {result.config_path}; reuse it with "
                     f"`stallscope train --pipeline-config {shlex.quote(str(result.config_path))}`")
    return lines


def _md_knobs(advice, own_dataset: bool = False) -> str:
    knobs = advice.command if own_dataset else fmt_knobs(advice.knobs) or advice.command
    return f" (`{knobs}`)" if knobs else ""


def _md_advice(diagnosis) -> list[str]:
    """The advice as a numbered list; for a dataset of the user's, each with its code, not stallscope's flags."""
    own_dataset = diagnosis.source.get("kind") == "dataset"
    lines = []
    for number, advice in enumerate(diagnosis.advice, 1):
        lines.append(f"{number}. **{advice.title}**{_md_knobs(advice, own_dataset)}{_gain(advice)}: {advice.reason}")
        if own_dataset and advice.code:
            lines += ["", "   ```python", *[f"   {code}" for code in advice.code.splitlines()], "   ```"]
    return lines


def markdown_lines(diagnosis, result=None) -> list[str]:
    parts = diagnosis.pipeline_breakdown
    lines = [
        f"# Diagnosis: {diagnosis.verdict} input-bound, cause: {diagnosis.cause}",
        "",
        f"Source `{diagnosis.source['path']}` ({diagnosis.source['kind']}, {diagnosis.source['examples']} examples), "
        f"pipeline `{diagnosis.pipeline.preset}`, accelerator `{diagnosis.accelerator}`; probes took "
        f"{diagnosis.seconds:.1f} s."
        + (f" {line[0].upper()}{line[1:]}." if (line := storage_line(diagnosis)) else ""),
        "",
        "## Per step",
        "",
        "| phase | step | compute | preprocessing stall | fetch stall | input share | verdict | cause |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in diagnosis.phases:
        lines.append(f"| {p.phase} | {_ms(p.step_ms)} | {_ms(p.compute_ms)} | {_ms(p.preprocessing_stall_ms)} | "
                     f"{_ms(p.fetch_stall_ms)} | {_pct(p.input_share)} | {p.verdict} | {p.cause} |")
    lines += ["", "## Pipeline alone", "",
              f"- {_warm_label(diagnosis)}: {_ms(parts.warm_ms)} per batch ({_ms(parts.cpu_ms)} CPU work on {parts.threads:g} "
              f"core(s), {_ms(parts.waiting_ms)} waiting)"]
    if parts.cold_ms is not None:
        lines.append(f"- cold cache: {_ms(parts.cold_ms)} per batch (storage adds {_ms(parts.storage_ms)})")
    for label, first, second in _io_rows(diagnosis):
        lines.append(f"- I/O per image, {label}: {first}, {second}")
    lines += ["", "## What if", "", "| phase | device images/s | step | input share | verdict |", "|---|---|---|---|---|"]
    for p in diagnosis.phases:
        for d in p.devices:
            lines.append(f"| {p.phase} | {d.device_images_per_second:,.0f} | {_ms(d.prediction.step_ms)} | "
                         f"{_pct(d.prediction.input_share)} | {d.prediction.verdict} |")
    if diagnosis.storage is not None or diagnosis.storage_whatif is not None:
        from stallscope.report.markdown import storage_markdown

        lines += ["", *storage_markdown(diagnosis.storage, diagnosis.storage_whatif)]
    lines += ["", "## Advice", ""]
    lines += _md_advice(diagnosis) or [f"None: {no_advice(diagnosis).split(', ', 1)[1]}."]
    if diagnosis.notes:
        lines += ["", *[f"> note: {note}" for note in diagnosis.notes]]
    if result is not None:
        lines += ["", "## Fix", "", "```", *fix_lines(result), "```"]
    return lines
