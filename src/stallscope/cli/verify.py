"""Re-read TFRecord shards and name any damage: shard, record index and byte offset.

Checks the framing checksums of every record, the record counts, sizes and sha256 against
manifest.json, that every record is an Example with a label in [0, N), and decodes every image with
TensorFlow. Without a manifest (seed-style files) it checks framing, records and images.
Exit code 0 when clean, 1 when anything is wrong.

examples:
  stallscope verify tfrecords
  stallscope verify tfrecords --no-decode
"""

from __future__ import annotations

import argparse

from stallscope.cli.flags import add_flag, add_storage_flag, existing_dir_or_url, non_negative_int


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("records_dir", type=existing_dir_or_url, metavar="RECORDS_DIR",
                        help="directory written by `stallscope convert`: a folder, gs://bucket/prefix or s3://bucket/prefix")
    add_flag(parser, "no_decode", action="store_true", help="skip decoding the images (framing, counts and sha256 only)")
    add_storage_flag(parser)
    add_flag(parser, "max_problems", type=non_negative_int, default=50, metavar="N", help="print at most N problems (default: 50)")


def run(args: argparse.Namespace) -> int:
    from stallscope.records.verify import verify_records
    from stallscope.tfimport import silence_cpp_stderr_at_exit, stderr_fd_silenced

    # libjpeg's warnings and TF's C++ log lines would repeat, unreadably, what the problems below say
    silence_cpp_stderr_at_exit()
    with stderr_fd_silenced():
        report = verify_records(args.records_dir, decode=not args.no_decode)
    for problem in report.problems[: args.max_problems]:
        print(problem)
    hidden = len(report.problems) - args.max_problems
    if hidden > 0:
        print(f"... and {hidden} more problem(s)")
    print(f"verify {args.records_dir}: {report.summary_line()}")
    return 0 if report.ok else 1
