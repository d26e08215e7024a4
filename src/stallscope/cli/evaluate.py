"""Top-1 and top-5 accuracy and loss of a training checkpoint on a split, once or on every new one.

The model is rebuilt from model.json beside the checkpoints (written by `train --checkpoint_path`),
so no model flags are needed. --watch follows a running training job: each new checkpoint is
evaluated as it appears (looking every --interval_secs), until --max-evaluations or Ctrl-C.
--cpu keeps evaluation off any GPU, so it can run beside a training job on the accelerator.

examples:
  stallscope evaluate --checkpoint_path ckpt --dataset_path data --split validation
  stallscope evaluate --checkpoint_path ckpt --dataset_path data --watch --interval_secs 300 --cpu
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stallscope.cli import flags


def add_parser(parser: argparse.ArgumentParser) -> None:
    flags.add_flag(parser, "checkpoint_path", type=Path, required=True, metavar="DIR",
                   help="a checkpoint directory written by `stallscope train --checkpoint_path` (with --watch "
                        "it may not exist yet)")
    flags.add_flag(parser, "source", choices=("files", "records"), default="files",
                   help="JPEG files or TFRecord shards (default: files)")
    flags.add_flag(parser, "dataset_path", type=flags.existing_dir_or_url, required=True, metavar="DIR|URL",
                   help="image tree or records directory: a folder, gs://bucket/prefix or s3://bucket/prefix")
    flags.add_storage_flag(parser)
    flags.add_flag(parser, "split", default="validation", help="split to evaluate (default: validation)")
    flags.add_flag(parser, "labels_file", "--labels", type=flags.existing_file, default=None, metavar="FILE",
                   help="one label per line, as given to train")
    flags.add_flag(parser, "batch_size", type=flags.positive_int, default=32, help="batch size (default: 32)")
    parser.add_argument("--watch", action="store_true", help="evaluate every new checkpoint as it appears")
    flags.add_flag(parser, "interval_secs", "--eval_interval_secs", type=flags.positive_float, default=300.0,
                   metavar="S", help="with --watch: seconds between looks for a new checkpoint (default: 300)")
    flags.add_flag(parser, "max_evaluations", type=flags.positive_int, default=None, metavar="N",
                   help="with --watch: stop after N evaluations (default: until Ctrl-C)")
    parser.add_argument("--cpu", action="store_true", help="hide GPUs from TensorFlow (evaluate on the CPU)")
    flags.add_flag(parser, "log_path", type=flags.creatable_dir, default=None,
                   metavar="DIR", help="write TensorBoard scalars (evaluation/top1, top5, loss) here")
    parser.add_argument("--json", action="store_true", help="print each result as one JSON line")


def hide_gpus() -> None:
    """Must run before TensorFlow touches a device."""
    from stallscope.tfimport import import_tensorflow

    tf = import_tensorflow()
    tf.config.set_visible_devices([], "GPU")


def format_result(result, *, as_json: bool) -> str:
    if as_json:
        return json.dumps(result.to_dict())
    step = f"step {result.step}" if result.step is not None else result.checkpoint
    return (f"{step}: top-1 {result.top1:.4f}, top-{result.k} {result.top5:.4f}, loss {result.loss:.4f} "
            f"({result.examples} examples, {result.seconds:.1f} s)")


def run(args: argparse.Namespace) -> int:
    if args.cpu:
        hide_gpus()
    from stallscope.workload.evaluate import EvaluateOptions, evaluate_latest, watch

    options = EvaluateOptions(
        checkpoint_path=args.checkpoint_path, dataset_path=args.dataset_path, source=args.source,
        split=args.split, labels_file=args.labels_file, batch_size=args.batch_size, watch=args.watch,
        interval_secs=args.interval_secs, max_evaluations=args.max_evaluations, log_path=args.log_path,
    )
    if not args.watch:
        print(format_result(evaluate_latest(options), as_json=args.json))
        return 0
    if not args.json:
        if options.checkpoint_path.exists():
            print(f"watching {options.checkpoint_path} every {options.interval_secs:g}s", flush=True)
        else:
            print(f"waiting for {options.checkpoint_path} to appear (written by `stallscope train --checkpoint_path`), "
                  f"looking every {options.interval_secs:g}s; Ctrl-C stops", flush=True)
    watch(options, lambda result: print(format_result(result, as_json=args.json), flush=True))
    return 0
