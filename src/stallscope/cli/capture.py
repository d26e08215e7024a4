"""Attach to a running job: capture a profile from its profiler server, as TensorBoard's "Capture
profile" button does, and print the same report as `stallscope analyze`.

The job needs one line: stallscope.serve_profiler(6009), which keeps the port to this machine
(TF's own tf.profiler.experimental.server.start(6009) listens on every interface, unauthenticated:
anyone who reaches the port can trace the job; serve_profiler(6009, host="0.0.0.0") opens it on purpose).

  stallscope capture localhost:6009 --duration 5s
  stallscope capture localhost:6009 --watch --interval 30s      one line per capture, Ctrl-C stops
  stallscope capture localhost:6009 --watch --json --count 10   one JSON object per line

Captures are kept under --log-path (default: a new capture-YYYYmmdd-HHMMSS); `stallscope analyze`
and TensorBoard (`tensorboard --logdir LOG_PATH`, Profile tab) read them again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stallscope.cli.analyze import add_report_flags, check_report_flags, print_report
from stallscope.cli.flags import add_flag, creatable_dir, duration, positive_int
from stallscope.errors import UsageError


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", metavar="HOST:PORT", help="the job's profiler server, e.g. localhost:6009")
    add_flag(parser, "duration", type=duration, default=5.0, help="how long to trace (default 5s)")
    add_flag(parser, "log_path", type=creatable_dir, default=None,
             help="directory to keep the captures in (default: a new capture-YYYYmmdd-HHMMSS)")
    add_flag(parser, "timeout", type=duration, default=30.0,
             help="how long past --duration to wait for the job's answer (default 30s)")
    add_flag(parser, "watch", action="store_true", help="capture again and again, one line per capture")
    add_flag(parser, "interval", type=duration, default=30.0,
             help="with --watch: time from one capture's start to the next (default 30s)")
    add_flag(parser, "count", type=positive_int, default=None, help="with --watch: stop after N captures")
    add_report_flags(parser)


def run(args: argparse.Namespace) -> int:
    from stallscope.analysis.captures import capture_and_analyze
    from stallscope.workload.capture import CaptureOptions, default_log_path

    options = CaptureOptions(address=args.address, log_path=args.log_path or default_log_path(),
                             duration_s=args.duration, timeout_s=args.timeout)
    if args.watch:
        return _watch(options, args)
    if args.count is not None:
        raise UsageError("--count: only with --watch")
    check_report_flags(args)
    capture_dir, analysis = capture_and_analyze(options, with_xprof=not args.no_xprof)
    print(f"captured {options.duration_s:g}s from {options.display} into {capture_dir}",
          file=sys.stderr if args.json else sys.stdout, flush=True)
    print_report(analysis, args)
    return 0


def _watch(options, args: argparse.Namespace) -> int:
    from stallscope.analysis.captures import watch

    if args.markdown or args.html is not None:
        raise UsageError("--watch: prints one line per capture (or --json); --markdown and --html need a single capture")
    print(f"watching {options.display}: {options.duration_s:g}s every {args.interval:g}s, captures in "
          f"{options.log_path}; Ctrl-C stops", file=sys.stderr, flush=True)
    done = 0
    try:
        for summary in watch(options, interval_s=args.interval, count=args.count):
            done += 1            # before the print: a Ctrl-C just after the line must count it
            print(json.dumps(summary.to_dict()) if args.json else _line(summary), flush=True)
    except KeyboardInterrupt:
        print(f"stopped after {done} capture(s)", file=sys.stderr)
    return 0


def _line(summary) -> str:
    from stallscope.report.text import fmt_ms, fmt_share
    from stallscope.verdict import verdict_phrase

    if summary.error:
        return f"{summary.time}  no steps: {summary.error}"
    return (f"{summary.time}  {summary.steps:>5} steps  step {fmt_ms(summary.step_ms):>9}  "
            f"input {fmt_share(summary.input_share):>6}  {verdict_phrase(summary.verdict)}  "
            f"bottleneck {summary.bottleneck or 'none found'}")
