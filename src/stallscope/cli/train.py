"""Fine-tune a keras.applications model from JPEG files or TFRecords, timing every step's input wait.

Every run writes RUN_DIR/summary.json (images/s, step time, input wait, input share, verdict, the
pipeline as asked and as run), steps.csv, pipeline.json, resources.json and TensorBoard scalars.
RUN_DIR is --log_path, or a new runs/<timestamp>-<model>-<source> named on screen.

With --checkpoint_path, a run killed mid-way and started again with the same flags resumes from
the last checkpoint (step count and optimizer state). --steps is the global step to reach.

Profiling: `--log_path DIR --profile_steps 10:20` captures a TF profile of steps 10..20 with step
markers; open it with `tensorboard --logdir DIR`, Profile tab (Input Pipeline Analyzer).

Emulated accelerator: `--accelerator emulated:2000` (images/s) or `emulated:15ms` (per step)
replaces the model step with a wait that uses no CPU, so a CPU-only machine shows whether the
pipeline would keep a fast device fed. No model is built.

The seeds' --base_model: `--base_model mobilenet` names the model; `--base_model=imagenet` (as
seed-000 used it) means MobileNet with ImageNet weights.

examples:
  stallscope train --source files --dataset_path data/train --accelerator emulated:2000 --steps 100
  stallscope train --source records --dataset_path records --pipeline seed --map-parallelism autotune
  stallscope train --dataset_path data --model inception_v3 --image_size 299 --weights imagenet \\
      --fine_tune last:30 --checkpoint_path ckpt --log_path runs/lr1e-4 --profile_steps 10:20
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from stallscope.cli import flags
from stallscope.cli.flags import pipeline_from_args  # the one home of this flag logic; imported here by callers
from stallscope.cpu_limits import cpu_named, quota_throttled
from stallscope.errors import UsageError
from stallscope.extras import install_line, installed
from stallscope.pipeline import config as pipeline_config
from stallscope.pipeline.config import STATIC_OPTIMIZATIONS, PipelineConfig, describe_knob, knob_docs
from stallscope.pipeline.presets import OFF, PRESETS
from stallscope.workload.batchnorm import BATCHNORM_MODES, DEFAULT_RECALIBRATION_IMAGES
from stallscope.service.servers import DEFAULT_CONNECT_TIMEOUT_S
from stallscope.workload.models import MODELS
from stallscope.verdict import fmt_share

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "0"}
_DEFAULT_PRESET = flags.DEFAULT_PRESET
# Knobs with their own seed-style flags elsewhere in this parser (or no flag at all).
_NOT_KNOBS = {"preset"}


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE | {"off"}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def knob_or_off(text: str):
    """A parallelism/buffer knob: a positive integer, 'autotune', or 'off' (no such stage)."""
    if text.strip().lower() in ("off", "none"):
        return OFF
    try:
        return flags.int_or_autotune(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, 'autotune' or 'off', got {text!r}") from None


def rewrite_switch(text: str):
    """A TF static rewrite: true/false forces it; 'default' leaves TF's choice."""
    if text.strip().lower() in ("default", "none", "tf"):
        return OFF
    return parse_bool(text)


def _knob_flag(field: dataclasses.Field) -> dict[str, Any]:
    """argparse keywords for a PipelineConfig field, from its type (new fields get flags for free)."""
    name, kind = field.name, str(field.type)
    if name in STATIC_OPTIMIZATIONS:
        return {"type": rewrite_switch, "metavar": "true|false|default"}
    if name == "data_service":
        return {"metavar": "HOST:PORT"}
    choices = getattr(pipeline_config, f"{name.upper()}_CHOICES", None)
    if choices is not None:
        return {"choices": choices}
    if kind == "bool":
        return {"type": parse_bool, "metavar": "true|false"}
    if kind == "int | None":
        return {"type": knob_or_off, "metavar": "N|autotune|off"}
    if kind == "int":
        return {"type": flags.non_negative_int, "metavar": "N"}
    return {"metavar": "PATH" if name.endswith("_path") else "VALUE"}


def render_knob(name: str, value: Any) -> str:
    """A knob's value as its flag spells it: autotune, off, default (TF's), true/false, none."""
    if name in STATIC_OPTIMIZATIONS:
        return "default" if value is None else str(value).lower()
    if isinstance(value, bool):
        return str(value).lower()
    field_type = str(next(f.type for f in dataclasses.fields(PipelineConfig) if f.name == name))
    if field_type == "int | None":
        return describe_knob(value)
    return str(value) if value != "" else "none"


def _knob_help(name: str) -> str:
    """The knob's meaning (from PipelineConfig's docstring) and its value in the default preset,
    plus the other presets' where they differ."""
    default = render_knob(name, getattr(PRESETS[_DEFAULT_PRESET], name))
    others = [f"{preset}: {render_knob(name, getattr(config, name))}" for preset, config in sorted(PRESETS.items())
              if preset != _DEFAULT_PRESET and render_knob(name, getattr(config, name)) != default]
    text = f"{knob_docs()[name].rstrip('.')} (default: {default}" + (f"; {', '.join(others)}" if others else "") + ")"
    return text.replace("%", "%%")


def knob_table() -> list[str]:
    """The README's table of pipeline knobs, made from the same sources as `--help`."""
    presets = sorted(PRESETS)
    lines = ["| flag | meaning | values | " + " | ".join(presets) + " |",
             "|---|---|---|" + "---|" * len(presets)]
    for field in dataclasses.fields(PipelineConfig):
        if field.name in _NOT_KNOBS:
            continue
        kwargs = _knob_flag(field)
        values = "\\|".join(kwargs["choices"]) if "choices" in kwargs else kwargs["metavar"].replace("|", "\\|")
        cells = [f"`--{field.name.replace('_', '-')}`", knob_docs()[field.name].replace("|", "\\|"), values]
        cells += [render_knob(field.name, getattr(PRESETS[p], field.name)) for p in presets]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def add_pipeline_flags(parser: argparse.ArgumentParser) -> None:
    """--pipeline PRESET, --pipeline-config FILE and one flag per PipelineConfig knob."""
    group = parser.add_argument_group("input pipeline (a preset, then single knobs override it)")
    flags.add_flag(group, "pipeline", choices=sorted(PRESETS), default=None,
                   help=f"named pipeline: seed (what the seeds wrote, TF's rewrites off), autotune, tuned "
                        f"(default: {_DEFAULT_PRESET})")
    flags.add_flag(group, "pipeline_config", type=flags.existing_file, default=None, metavar="FILE",
                   help="a saved PipelineConfig JSON (e.g. from `diagnose --fix`); knob flags override it")
    add_knob_flags(group)
    flags.add_flag(group, "data_service_timeout", type=flags.duration, default=DEFAULT_CONNECT_TIMEOUT_S,
                   metavar="DURATION", help=f"with --data-service: give up if the dispatcher does not answer, "
                                            f"or the service sends no batch (no worker, or one that stopped), "
                                            f"within this long (default: {DEFAULT_CONNECT_TIMEOUT_S:g}s)")


def add_knob_flags(group: argparse._ActionsContainer) -> None:
    """One flag per PipelineConfig knob (dest knob_NAME, default None: not given)."""
    for field in dataclasses.fields(PipelineConfig):
        if field.name in _NOT_KNOBS:
            continue
        kwargs = _knob_flag(field)
        flags.add_flag(group, field.name, default=None, dest=f"knob_{field.name}", help=_knob_help(field.name),
                       **kwargs)


def knob_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The knob flags the user gave, as {knob: value} ('off' switches a knob off)."""
    return {field.name: getattr(args, f"knob_{field.name}") for field in dataclasses.fields(PipelineConfig)
            if getattr(args, f"knob_{field.name}", None) is not None}


def require_data_service(pipeline: PipelineConfig, args: argparse.Namespace, out=None) -> None:
    """A --data-service dispatcher must answer before TensorFlow is handed its address (TF would
    wait for it forever, deaf to Ctrl-C); says so when it does not answer at once."""
    if not pipeline.data_service:
        return
    from stallscope.service.servers import require_reachable

    def waiting() -> None:
        print(f"waiting up to {args.data_service_timeout:g} s for the tf.data service dispatcher at "
              f"{pipeline.data_service}", file=out or sys.stdout, flush=True)

    require_reachable(pipeline.data_service, args.data_service_timeout, on_wait=waiting)


def resolve_model_flags(model: str | None, base_model: str | None, weights: str | None) -> tuple[str, str]:
    """(model, weights) from --model, the seeds' --base_model and --weights."""
    if base_model is not None:
        text = base_model.strip().lower()
        if text == "imagenet":  # seed-000: --base_model=imagenet meant MobileNet with ImageNet weights
            implied_model, implied_weights = "mobilenet", "imagenet"
        elif text in MODELS:
            implied_model, implied_weights = text, None
        else:
            raise UsageError(f"--base-model: expected a model ({', '.join(MODELS)}) or 'imagenet', got {base_model!r}")
        if model is not None and model != implied_model:
            raise UsageError(f"--base-model: {base_model!r} means model {implied_model!r}, but --model says {model!r}")
        if weights is not None and implied_weights is not None and weights != implied_weights:
            raise UsageError(f"--base-model: 'imagenet' means ImageNet weights, but --weights says {weights!r}")
        model = implied_model
        weights = weights or implied_weights
    return model or "mobilenet", weights or "none"


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """The data, model and accelerator flags shared by `train` and the diagnosis probes."""
    data = parser.add_argument_group("data (the seeds' flags)")
    flags.add_flag(data, "source", choices=("files", "records"), default="files",
                   help="read JPEG files ({label}/* or {split}/{label}/*) or TFRecord shards (default: files)")
    flags.add_flag(data, "dataset_path", type=flags.data_location, default=Path("images"), metavar="DIR|URL",
                   help="image tree or records directory: a folder, gs://bucket/prefix or s3://bucket/prefix "
                        "(default: images, as seed-000)")
    flags.add_storage_flag(data)
    flags.add_flag(data, "split", default="train", help="split to train on (default: train)")
    flags.add_flag(data, "labels_file", "--labels", type=flags.existing_file, default=None, metavar="FILE",
                   help="one label per line: fixes the class order")
    flags.add_flag(data, "dataset_size", type=flags.positive_int, default=None, metavar="N",
                   help="examples per epoch (default: the whole split)")
    model = parser.add_argument_group("model")
    flags.add_flag(model, "model", choices=sorted(MODELS), default=None,
                   help="keras.applications base (default: mobilenet)")
    flags.add_flag(model, "base_model", default=None, metavar="NAME|imagenet",
                   help="seed-000's flag: a model name, or 'imagenet' for MobileNet with ImageNet weights")
    flags.add_flag(model, "alpha", type=flags.positive_float, default=1.0,
                   help="MobileNet/MobileNetV2 width multiplier (default: 1.0)")
    flags.add_flag(model, "weights", default=None, metavar="none|imagenet|PATH",
                   help="base weights: none, imagenet (Keras downloads them) or a weights file (default: none)")
    flags.add_flag(model, "fine_tune", default="head", metavar="head|full|last:N",
                   help="train the head only, everything, or the last N base layers too (default: head)")
    flags.add_flag(model, "batchnorm", choices=BATCHNORM_MODES, default=None,
                   help="BatchNorm layers of a base that trains: frozen (inference mode, statistics, scale and offset "
                        "kept; the default with pretrained weights), recalibrate (they train on batch statistics and "
                        "their moving mean/variance are recomputed over training images before every checkpoint "
                        "and validation, those of frozen layers once at the start; the default with --weights "
                        "none), momentum (Keras' moving averages "
                        "only, which lag behind the weights on short runs)")
    flags.add_flag(model, "recalibration_images", type=flags.positive_int, default=DEFAULT_RECALIBRATION_IMAGES,
                   metavar="N", help="with --batchnorm recalibrate: training images the statistics are computed "
                                     f"over (default: {DEFAULT_RECALIBRATION_IMAGES})")
    flags.add_flag(model, "accelerator", default="real", metavar="real|emulated:IPS|emulated:MSms",
                   help="run the model, or emulate a device of that many images/s or ms per step (default: real)")


def add_parser(parser: argparse.ArgumentParser) -> None:
    add_workload_flags(parser)
    training = parser.add_argument_group("training")
    flags.add_flag(training, "steps", type=flags.positive_int, default=None, metavar="N",
                   help="train until global step N (a resumed run continues to N); default: --epochs")
    flags.add_flag(training, "epochs", type=flags.positive_int, default=1, help="passes over the data (default: 1)")
    flags.add_precision_flags(training, each="training (the data repeating)", instead="--steps",
                              reported="every run reports the precision it reached")
    flags.add_flag(training, "cold", action="store_true",
                   help="evict the data's files from the page cache first (local files; a mount's kernel cache, so "
                        "every read goes to its server again); not applicable to gs:// and s3://, whose readers "
                        "start every run cold")
    flags.add_flag(training, "learning_rate", type=flags.positive_float, default=1e-4,
                   help="Adam learning rate (default: 1e-4)")
    flags.add_flag(training, "validation_path", type=flags.data_location, default=None, metavar="DIR|URL",
                   help="held-out data evaluated at the end (its validation split, or a {label}/* tree)")
    flags.add_flag(training, "warmup_steps", type=flags.non_negative_int, default=2,
                   help="first steps left out of the means (tracing; default: 2)")
    out = parser.add_argument_group("output")
    flags.add_flag(out, "log_path", type=flags.creatable_dir, default=None, metavar="DIR",
                   help="run directory (default: a new runs/<timestamp>-<model>-<source>)")
    flags.add_flag(out, "checkpoint_path", type=flags.creatable_dir, default=None, metavar="DIR",
                   help="checkpoints (resumed from when present); default: none")
    flags.add_flag(out, "checkpoint_every", type=flags.positive_int, default=500, metavar="N",
                   help="save every N steps, and at the end (default: 500)")
    flags.add_flag(out, "profile_steps", default=None, metavar="START:STOP",
                   help="capture a TF profile of these global steps into the run directory")
    flags.add_flag(out, "log_every", type=flags.positive_int, default=10, metavar="N",
                   help="print a step line and write TensorBoard scalars every N steps (default: 10)")
    add_pipeline_flags(parser)


def train_options_from_args(args: argparse.Namespace, **overrides):
    """TrainOptions from parsed flags (shared with the diagnosis)."""
    from stallscope.workload.train import TrainOptions

    model, weights = resolve_model_flags(args.model, args.base_model, args.weights)
    pipeline = pipeline_from_args(args)
    values = dict(
        source=args.source, dataset_path=args.dataset_path, split=args.split, labels_file=args.labels_file,
        dataset_size=args.dataset_size, model=model, alpha=args.alpha, weights=weights,
        fine_tune=args.fine_tune, batchnorm=args.batchnorm, recalibration_images=args.recalibration_images,
        accelerator=args.accelerator, pipeline=pipeline,
        seed=pipeline.seed,
    )
    if getattr(args, "data_service_timeout", None) is not None:
        values["data_service_timeout_s"] = args.data_service_timeout
    if getattr(args, "precision", None) is not None:
        from stallscope.workload.precision import PrecisionTarget

        values["precision"] = PrecisionTarget(args.precision, args.min_seconds, args.max_seconds)
    for name in ("steps", "epochs", "cold", "learning_rate", "validation_path", "warmup_steps", "log_path",
                 "checkpoint_path", "checkpoint_every", "profile_steps", "log_every"):
        if hasattr(args, name):
            values[name] = getattr(args, name)
    values.update(overrides)
    return TrainOptions(**values)


def format_summary(summary: dict[str, Any]) -> list[str]:
    """The end-of-run lines: step time, input wait, input share and verdict."""
    accelerator = summary["accelerator"]["spec"]
    precision = summary.get("precision") or {}
    lines = [  # a run too short to trust says so before its figures
        *([f"warning         {precision['warning']}"] if precision.get("warning") else []),
        f"steps           {summary['first_step']}..{summary['last_step']} "
        f"({summary['measured_steps']} measured, {summary['warmup_steps']} warm-up)",
        f"pipeline        {summary['pipeline']['preset']}: {' <- '.join(summary['pipeline']['ran']) or '?'}",
        f"reader          {summary['source'].get('reader', '?')}",
        *([f"storage         {summary['source']['storage']['label']}"] if summary["source"].get("storage") else []),
        f"accelerator     {accelerator}",
    ]
    if summary["pipeline"]["requested"].get("normalize") == "none":
        lines.append("pixels          0..255 from the pipeline, scaled by the model's first layer on the device")
    coverage = summary.get("split_coverage") or {}
    if coverage.get("dropped"):
        lines.append(f"images          {coverage['images_trained']:,} of the {coverage['images_in_split']:,} in the split "
                     f"trained; {coverage['dropped']:,} dropped: {coverage['why_dropped']}")
    lines += [
        f"throughput      {summary['images_per_second']:.1f} images/s{left_out_text(summary)}",
        f"step time       {summary['step_time_ms']:.1f} ms (p50 {summary['step_time_p50_ms']:.1f}, "
        f"p90 {summary['step_time_p90_ms']:.1f})",
        f"input wait      {summary['input_wait_ms']:.1f} ms per step",
        f"input share     {fmt_share(summary['input_share'])} -> {summary['verdict']} input-bound",
    ]
    if summary.get("cpu"):
        lines.append(f"CPU             {cpu_line(summary['cpu'])}")
        if throttled := quota_throttled(summary["cpu"]):
            lines.append(f"CPU quota       {throttled}")
    if summary.get("minor_faults_per_image") is not None:
        lines.append(f"page faults     {summary['minor_faults_per_image']:.0f} minor per image")
    if summary.get("cold"):
        lines.append(f"cold start      {summary['cold']['how']}")
    lines += precision_lines(summary.get("precision"), with_warning=False)  # the warning leads
    if summary.get("fetched"):
        lines.append(f"fetched         {fetched_line(summary['fetched'])}")
    made = summary.get("store_requests")
    if made:
        per_image = f" ({made['requests_per_image']:.3g} per image trained)" if made.get("requests_per_image") else ""
        lines.append(f"store requests  {made['requests']:,}{per_image}, {made['bytes'] / 1e6:,.1f} MB; "
                     f"{made['median_ms']:.1f} ms median, {made['p90_ms']:.1f} ms p90 from asking to the last byte "
                     f"(stallscope's reader)")
    if summary.get("store_latency"):
        lines.append(f"store latency   {store_latency_line(summary['store_latency'])}")
    if summary.get("final_loss") is not None:
        lines.append(f"loss            {summary['final_loss']:.4f}")
    if summary.get("train_top1_last_10") is not None:
        lines.append(f"train top-1     {summary['train_top1_last_10']:.3f} (last 10 steps, training mode)")
    if summary.get("batchnorm"):
        lines.append(f"batchnorm       {format_batchnorm(summary['batchnorm'])}")
    validation = summary.get("validation")
    if validation:
        lines.append(f"validation      top-1 {validation['top1']:.3f}, top-{validation['k']} {validation['top5']:.3f}, "
                     f"loss {validation['loss']:.4f} ({validation['examples']} examples)")
    if summary.get("checkpoint"):
        lines.append(f"checkpoint      {summary['checkpoint']['latest']}")
    return lines


def format_batchnorm(batchnorm: dict[str, Any]) -> str:
    """What the run did with the base's BatchNorm layers, and why."""
    mode, trained = batchnorm["mode"], batchnorm["trained_layers"]
    why = " (default for these weights)" if batchnorm["default"] else ""
    if mode == "frozen":
        return f"frozen: {batchnorm['layers']} layer(s) in inference mode, statistics kept{why}"
    if mode == "momentum":
        return f"momentum: {trained} layer(s) trained, moving averages by momentum only{why}"
    start = batchnorm["frozen_layers_calibrated_at_start"]
    start = f"; {start} frozen layer(s) calibrated once at the start" if start else ""
    if batchnorm["recalibrations"]:
        return (f"recalibrated: moving statistics of {trained} trained layer(s) recomputed over "
                f"{batchnorm['recalibration_images']} training images{start}{why}")
    return f"recalibrate: no trained layer to recalibrate{why}" if not trained else f"recalibrate: not reached{why}"


def run(args: argparse.Namespace) -> int:
    from stallscope.workload.train import run_training

    options = train_options_from_args(args)
    require_data_service(options.pipeline, args)
    if options.log_path is None:
        from stallscope.workload.train import new_run_dir

        model = "emulated" if options.accelerator.emulated else options.model
        options = dataclasses.replace(options, log_path=new_run_dir(model, options.source))
    announced = []

    def announce_run_dir() -> None:
        """Once the run directory exists (the first step is past it): a run that fails before it
        makes the folder names none."""
        if not announced:
            print(f"run directory: {options.log_path}", flush=True)
            announced.append(True)

    def on_step(progress) -> None:
        announce_run_dir()
        if progress.log_line:
            print(progress.log_line, flush=True)

    def service_silent(message: str) -> None:
        """The service sent no batch in time: the thread waiting in TF cannot stop, so the process
        ends here, its output flushed, with the one line."""
        sys.stdout.flush()
        print(f"stallscope train: error: {message}", file=sys.stderr, flush=True)
        os._exit(2)

    result = run_training(options, on_step=on_step, on_service_silent=service_silent)
    announce_run_dir()
    if not result.steps:
        print(f"nothing to do: the checkpoint is already at step {result.summary['last_step']}")
        return 0
    for line in format_summary(result.summary):
        print(line)
    print(f"summary         {result.run_dir / 'summary.json'}")
    if result.summary.get("profile"):
        if result.summary["profile"]["files"]:
            tab = "Profile tab" if installed("tensorboard_plugin_profile") else f"Profile tab: {install_line('xprof')}"
            print(f"profile         tensorboard --logdir {shlex.quote(str(result.run_dir))}  ({tab})")
        else:
            print(f"profile         none written: the run never reached steps {result.summary['profile']['steps']}",
                  file=sys.stderr)
    return 0


def cpu_line(cpu: dict) -> str:
    """'1.48 of 2 cores busy (this process 1.47)': one unit, cores, for the machine and the process (the
    machine's share is of the cores the run may use, the process's of one core); a run too short to
    sample says so instead of a 0."""
    machine, process = cpu.get("system_mean_percent"), cpu.get("process_mean_percent")
    own = f"this process {process / 100:.2f}" if process is not None else "this process unknown"
    cores = cpu.get("cores")
    if machine is None:
        return (f"not sampled (a run of {cpu.get('duration_s', 0):.2f} s on {cpu_named(cpu)}); {own} cores, "
                f"from its CPU time")
    if not isinstance(cores, (int, float)):
        return f"{machine:.0f}% of its cores busy, how many unknown ({own} cores)"
    return f"{machine / 100 * cores:.2f} of {cpu_named(cpu)} busy ({own})"


def left_out_text(summary: dict[str, Any]) -> str:
    """What the images/s leaves out, said beside it where the run is too short to trust: its warm-up
    steps (a shuffle's fill among them) are not in the figure."""
    warmup = summary.get("warmup_steps") or 0
    if not (summary.get("precision") or {}).get("warning") or not warmup:
        return ""
    return (f" over {summary['measured_steps']} measured steps; its first {warmup} step(s), warm-up (a buffer's "
            f"fill among them), left out")


def precision_lines(precision: dict | None, *, with_warning: bool = True) -> list[str]:
    """How far the images/s can be trusted: its halves' agreement, and a warning where it is too short."""
    if not precision:
        return []
    lines = []
    pair = precision.get("halves_images_per_second")
    if pair:
        target = precision.get("target")
        aim = (f"; target {target:.0%}: {'reached' if precision['reached'] else 'not reached'}, stopped by "
               f"{precision['stopped_by'].replace('_', ' ')}") if target is not None else ""
        lines.append(f"precision       halves {pair[0]:,.1f} and {pair[1]:,.1f} images/s, {precision['spread']:.1%} "
                     f"apart over {precision['measured_s']:.1f} s measured{aim}")
    if precision.get("warning") and with_warning:
        lines.append(f"warning         {precision['warning']}")
    return lines


def fetched_line(fetched: dict) -> str:
    """'608 requests, 98.7 MB served by the store: 1.52 requests and 247 KB per image trained; read
    amplification 3.9x (bytes fetched per byte trained)'."""
    unit = "read calls" if fetched["basis"] == "process" else "requests"
    by = {"store": "served by the store", "reader": "by stallscope's reader",
          "process": "read by this process"}[fetched["basis"]]
    amplification = fetched.get("read_amplification")
    amplified = (f"; read amplification {amplification:.2f}x (bytes fetched per byte trained)"
                 if amplification is not None else "")
    return (f"{fetched['requests']:,} {unit}, {fetched['bytes'] / 1e6:,.1f} MB {by}: "
            f"{fetched['requests_per_image']:.3g} {unit} and {fetched['bytes_per_image'] / 1e3:,.1f} KB "
            f"per image trained{amplified}")


def store_latency_line(latency: dict) -> str:
    """A request's time at the emulated store, whichever client asked."""
    return (f"p50 {latency['p50_ms']:.1f} ms, p90 {latency['p90_ms']:.1f}, p99 {latency['p99_ms']:.1f} "
            f"({latency['requests']:,} requests timed at the store, arrival to last byte)")
