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
side by side, and saves the config for `stallscope train --pipeline-config FILE`. Where no advice changes
the pipeline (it keeps up, or the advice is a tf.data service), it saves the config as diagnosed, saying why.

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
import shlex
import sys
from pathlib import Path

from stallscope.cli import flags
from stallscope.cli.train import (add_pipeline_flags, add_workload_flags, require_data_service,
                                  train_options_from_args)
from stallscope.errors import UsageError

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
    flags.add_precision_flags(probes, each="each end-to-end probe", instead="--probe-steps",
                              reported="the report states the precision reached")
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
                        "reader, obstore unless STALLSCOPE_S3_READER=s3fs; else the pipeline's --gcs-reader)")
    flags.add_flag(storage, "storage_counters", type=flags.existing_file, default=None, metavar="FILE",
                   help='a store\'s counters, {"requests": N, "connections": N, "bytes": N} (written by '
                        "`stallscope storage serve`): requests and connections per image are then measured by "
                        "the store (data read by stallscope's own reader has its requests counted without one)")
    flags.add_service_flags(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the diagnosis as JSON (input_share, cause, ...)")
    out.add_argument("--markdown", action="store_true", help="print the diagnosis as Markdown")
    out.add_argument("--fix", action="store_true",
                     help="apply the advice, run again, print before / predicted / after, save the config (where "
                          "no advice changes the pipeline, the config as diagnosed, saying why)")
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
    for flag, value in (("--storage-counters", args.storage_counters), ("--precision", args.precision)):
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
                                     storage_client=args.storage_client, work_dir=args.work_dir,
                                     service=flags.service_from_args(args))
    return diagnose_dataset(dataset, model=model, options=options, progress=progress)


def options_from_args(args: argparse.Namespace):
    from stallscope.analysis.differential import DiagnoseOptions

    if args.json and args.markdown:
        raise UsageError("--markdown: give either --json or --markdown, not both")
    if args.precision is not None and args.max_seconds < args.min_seconds:
        raise UsageError(f"--max-seconds: expected at least --min-seconds ({args.min_seconds:g}s), "
                         f"got {args.max_seconds:g}s")
    train = train_options_from_args(args)
    return DiagnoseOptions(
        train=train, phases=args.phases or (train.fine_tune,), probe_steps=args.probe_steps,
        pipeline_budget_s=args.pipeline_budget, cold_cache=not args.no_cold_cache, work_dir=args.work_dir,
        storage_scenarios=tuple(s for group in args.what_if_storage or () for s in group),
        storage_client=args.storage_client, storage_counters=args.storage_counters,
        service=flags.service_from_args(args),
    )


def run(args: argparse.Namespace) -> int:
    from stallscope.analysis.differential import diagnose, open_probed_source
    from stallscope.analysis.fix_loop import fix, keep_config
    from stallscope.report.diagnosis import diagnosis_text, markdown_lines, report_lines

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
            print(diagnosis_text(diagnosis))
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
    result = kept = None
    if args.fix:
        if any(a.knobs for a in diagnosis.advice):
            result = fix(options, diagnosis, save_to=args.fixed_config, progress=progress, source=source)
        else:  # the config as diagnosed, so `train --pipeline-config FILE` after --fix runs whatever the verdict
            kept = keep_config(diagnosis, save_to=args.fixed_config)
    if args.json:
        data = diagnosis.to_dict()
        if result is not None or kept is not None:
            data["fix"] = (result or kept).to_dict()
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif args.markdown:
        lines = markdown_lines(diagnosis, result)
        if kept is not None:
            lines += ["", "## Fix", "", "```", *kept_lines(kept), "```"]
        sys.stdout.write("\n".join(lines) + "\n")
    else:
        print("\n".join(report_lines(diagnosis, result) + (["", *kept_lines(kept)] if kept is not None else [])))
    if kept is not None and quiet:
        progress(kept_lines(kept)[-1])
    return 0


def kept_lines(kept) -> list[str]:
    """--fix with no pipeline change: why, the advice outside the config, and where the config was saved."""
    lines = [f"fix: {kept.reason}"]
    lines += [f"  outside the pipeline config: {a.title}" + (f" ({a.command})" if a.command else "") for a in kept.outside]
    lines.append(f"pipeline saved unchanged to {kept.config_path}; `stallscope train --pipeline-config "
                 f"{shlex.quote(str(kept.config_path))}` runs it as diagnosed")
    return lines
