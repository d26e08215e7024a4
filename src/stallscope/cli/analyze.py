"""Diagnose a run or a profile: how much of each step waits for input, which tf.data stage is the
bottleneck, seed-004's checklist with evidence, and the fix.

RUN_DIR_OR_PROFILE is a run directory written by `stallscope train --profile_steps`, any log
directory holding captures at any depth (a Keras TensorBoard `log_dir`, whose profile is under
train/plugins/profile/<time>/), a capture directory, or a *.xplane.pb file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from stallscope.cli.flags import add_flag, add_service_flags, service_from_args
from stallscope.errors import UsageError
from stallscope.extras import require


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="RUN_DIR_OR_PROFILE", help="run or log directory (captures found at any depth), capture directory or .xplane.pb")
    add_flag(parser, "capture", metavar="NAME", default=None,
             help="which capture to read when there are several (default: the newest)")
    add_report_flags(parser)
    add_service_flags(parser)


def add_report_flags(parser: argparse.ArgumentParser) -> None:
    """--json, --markdown, --html, --no-xprof: how an analysis is shown (also used by `capture`)."""
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the analysis as JSON (input_share, bottleneck, ...)")
    output.add_argument("--markdown", action="store_true", help="print the analysis as Markdown")
    add_flag(parser, "html", metavar="FILE", type=Path, default=None,
             help="also write an HTML report with plots to FILE")
    add_flag(parser, "no_xprof", action="store_true",
             help="skip TensorBoard's Input Pipeline Analyzer (xprof) cross-check")


def run(args: argparse.Namespace) -> int:
    from stallscope.analysis.analyze import analyze_run

    check_report_flags(args)
    print_report(analyze_run(args.path, with_xprof=not args.no_xprof, capture=args.capture,
                             service=service_from_args(args)), args)
    return 0


def check_report_flags(args: argparse.Namespace) -> None:
    """Before any work: an --html file that cannot be written is refused before a report is printed, not after."""
    if args.html is None:
        return
    require("report", "--html", "matplotlib")
    path = args.html
    if path.is_dir():
        raise UsageError(f"--html: {str(path)!r} is a directory; expected a file name such as report.html")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"--html: {str(folder)!r} is not an existing folder; expected a file in one")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"--html: cannot write {str(path)!r} (permission denied)")


def print_report(analysis, args: argparse.Namespace) -> None:
    """Prints the analysis as the report flags ask (text by default) and writes --html."""
    if args.json:
        sys.stdout.write(analysis.to_json() + "\n")
    elif args.markdown:
        from stallscope.report.markdown import render_markdown

        sys.stdout.write(render_markdown(analysis))
    else:
        from stallscope.report.text import render_text

        sys.stdout.write(render_text(analysis))
    if args.html is not None:
        from stallscope.report.html import render_html

        try:
            args.html.write_text(render_html(analysis), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--html: cannot write {str(args.html)!r} ({exc.strerror})") from None
        print(f"HTML report written to {args.html}", file=sys.stderr if args.json else sys.stdout)
