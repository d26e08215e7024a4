"""Convert an image folder tree to verified, sharded TFRecords.

Input: a `{label}/*` or `{split}/{label}/*` tree (train/validation as in seed-003). Every image is
checked by its content and decoded once (a JPEG kept as is: its whole compressed stream, `--check`);
JPEGs TensorFlow reads are kept byte for byte, other formats, CMYK, grayscale and rotated images are
re-encoded as RGB JPEG (a JPEG source keeps its quality), unusable files are skipped
with their reason in manifest.json. Shards are named `{split}-00000-of-00016.tfrecord`; a killed
conversion run again finishes with the same result.

examples:
  stallscope convert images --output_path tfrecords
  stallscope convert --dataset_path=images --size_per_record=52428800 --output_path=tfrecords
  stallscope convert data --shards 16 --validation-shards 4 --schema seed --max-side 512
  stallscope convert s3://bucket/images --output_path s3://bucket/tfrecords --shards 16
  stallscope convert /mnt/nfs/images --output_path tfrecords --read-ahead 16
  stallscope convert data --shards 64 --runner beam --beam-option --direct_num_workers=2
"""

from __future__ import annotations

import contextlib

import argparse

from stallscope.cli.flags import (
    add_flag, add_storage_flag, byte_size, count_or_auto, existing_file, jpeg_quality, non_negative_int, positive_int,
)
from stallscope.cli.progress import ProgressBar
from stallscope.cli.signals import sigterm_as_interrupt
from stallscope.data.images import CHECK_CHOICES


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", nargs="?", metavar="DATASET_PATH", help="the image tree (same as --dataset_path)")
    add_flag(parser, "dataset_path", default=None,
             help="the image tree: {label}/* or {split}/{label}/*, a folder, gs://bucket/prefix or s3://bucket/prefix "
                  "(default: images)")
    add_flag(parser, "output_path", default="tfrecords",
             help="directory for the shards and manifest.json: a folder, gs://bucket/prefix or s3://bucket/prefix "
                  "(default: tfrecords)")
    add_flag(parser, "replace", action="store_true",
             help="replace a finished or unfinished conversion of another source, shard plan or image option "
                  "in --output_path (default: refuse it; a rerun of the same one resumes or repeats it)")
    add_flag(parser, "staging_dir", default=None, metavar="DIR",
             help="where an --output_path in a bucket is converted first, then uploaded: it holds the whole output "
                  "until published, and an interrupted run's shards until the same command resumes (default: "
                  "$XDG_CACHE_HOME/stallscope/convert-staging, else ~/.cache/stallscope/convert-staging)")
    add_storage_flag(parser)
    add_flag(parser, "labels", type=existing_file, default=None, metavar="FILE",
             help="one label per line; the line order fixes the label indices (default: sorted folder names)")
    sharding = parser.add_mutually_exclusive_group()
    add_flag(sharding, "size_per_record", type=byte_size, default=None, metavar="BYTES",
             help="start a new shard once the current one holds this many image bytes: 52428800, 50M (default: 50M)")
    add_flag(sharding, "shards", type=positive_int, default=None, metavar="N", help="N shards per split")
    add_flag(parser, "train_shards", type=positive_int, default=None, metavar="N", help="shards for the train split")
    add_flag(parser, "validation_shards", type=positive_int, default=None, metavar="N", help="shards for the validation split")
    add_flag(parser, "workers", type=positive_int, default=None, metavar="N", help="worker processes (default: the cores + 1)")
    add_flag(parser, "read_ahead", type=count_or_auto, default=None, metavar="N",
             help="files each worker reads ahead of its checks, or 'auto': ahead only where reads wait, as on a "
                  "network file system or a FUSE mount of a bucket, by enough files to cover a read (default: auto)")
    add_flag(parser, "schema", choices=("standard", "seed"), default="standard",
             help="feature keys: standard image/* keys, or seed-002's name/category/data (default: standard)")
    add_flag(parser, "max_side", type=positive_int, default=None, metavar="PIXELS",
             help="downscale images whose longer side exceeds this (default: keep sizes)")
    add_flag(parser, "jpeg_quality", type=jpeg_quality, default="keep", metavar="Q",
             help="quality of re-encoded images, 1..100, or 'keep': a JPEG source keeps its own quantisation "
                  "tables, other formats get 95 (default: keep)")
    add_flag(parser, "check", choices=CHECK_CHOICES, default="stream",
             help="how a JPEG kept byte for byte is checked: 'stream' decodes its whole compressed stream and "
                  "rebuilds pixels at 1/8 scale (same verdict, faster), 'full' decodes every pixel (default: stream)")
    add_flag(parser, "max_pixels", type=positive_int, default=None, metavar="N",
             help="skip images with more pixels than this as too large to decode (default: 89478485, Pillow's limit)")
    add_flag(parser, "follow_links", action="store_true",
             help="read files whose symbolic links lead out of the dataset path (default: skip them, with their "
                  "reason in manifest.json, reading none of their bytes)")
    add_flag(parser, "seed", type=non_negative_int, default=0, help="seed of the shuffle across shards (default: 0)")
    add_flag(parser, "no_progress", action="store_true", help="no progress bar")
    add_flag(parser, "runner", choices=("local", "beam"), default="local",
             help="'local': processes on this machine; 'beam': an Apache Beam pipeline, one shard per element, "
                  "same plan, shards and manifest (default: local)")
    add_flag(parser, "beam_option", action="append", default=[], metavar="OPTION",
             help="an Apache Beam pipeline option, repeatable: --beam-option --runner=DataflowRunner "
                  "--beam-option --num_workers=64 (default runner: FnApiRunner, on this machine)")
    add_flag(parser, "beam_options_file", type=existing_file, default=None, metavar="FILE",
             help="Beam pipeline options as on a command line, '#' comments; --beam-option values come after")
    _values_may_look_like_flags(parser, ("--beam-option", "--beam_option"))


def _values_may_look_like_flags(parser: argparse.ArgumentParser, flags: tuple[str, ...]) -> None:
    """`--beam-option --runner=X`: argparse would take `--runner=X` for a flag of ours and refuse; the
    pair is joined into `--beam-option=--runner=X` before this command's parser sees it."""
    parse_known_args = parser.parse_known_args

    def joined(args=None, namespace=None):
        args = list(args or [])
        out = []
        i = 0
        while i < len(args):
            if args[i] in flags and i + 1 < len(args):
                out.append(f"{args[i]}={args[i + 1]}")
                i += 2
            else:
                out.append(args[i])
                i += 1
        return parse_known_args(out, namespace)

    parser.parse_known_args = joined  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> int:
    from stallscope.data.images import DEFAULT_MAX_PIXELS
    from stallscope.errors import UsageError
    from stallscope.records.convert import ConvertOptions, convert_tree, format_summary

    if args.dataset and args.dataset_path and args.dataset != args.dataset_path:
        raise UsageError(f"dataset path given twice: {args.dataset!r} and --dataset_path {args.dataset_path!r}; expected one")
    split_shards = tuple((split, n) for split, n in (("train", args.train_shards), ("validation", args.validation_shards)) if n)
    options = ConvertOptions(
        dataset_path=args.dataset or args.dataset_path or "images",
        output_path=args.output_path,
        labels_file=args.labels,
        size_per_record=args.size_per_record,
        shards=args.shards,
        split_shards=split_shards,
        workers=args.workers,
        schema=args.schema,
        max_side=args.max_side,
        jpeg_quality=args.jpeg_quality,
        check=args.check,
        max_pixels=args.max_pixels or DEFAULT_MAX_PIXELS,
        seed=args.seed,
        read_ahead=args.read_ahead,
        replace=args.replace,
        staging_dir=args.staging_dir,
        follow_links=args.follow_links,
    )
    if args.runner == "beam":
        from stallscope.records.beam_convert import convert_with_beam, pipeline_args
        from stallscope.records.beam_workers import beam_stops_on_interrupt, worker_output_aside

        beam_args = pipeline_args(args.beam_option, args.beam_options_file)
        # Beam's workers and runner log to a file, not over the progress bar and the one line (--debug: here)
        aside = contextlib.nullcontext() if args.debug or args.verbose else worker_output_aside()
        with sigterm_as_interrupt(), aside, ProgressBar("convert (beam)", enabled=not args.no_progress) as bar:
            with beam_stops_on_interrupt():  # SIGTERM, as Ctrl-C: Beam's workers stopped, one line
                report = convert_with_beam(options, beam_args, progress=bar.to if bar.enabled else None)
    else:
        if args.beam_option or args.beam_options_file:
            flag = "--beam-option" if args.beam_option else "--beam-options-file"
            raise UsageError(f"{flag}: applies to --runner beam; expected --runner beam with it, got --runner {args.runner}")
        with sigterm_as_interrupt(), ProgressBar("convert", enabled=not args.no_progress) as bar:
            report = convert_tree(options, progress=bar.to)  # SIGTERM: the workers stopped, one line, as Ctrl-C
    print("\n".join(format_summary(report)))
    return 0
