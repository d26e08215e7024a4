"""The `stallscope` console script: dispatches to one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from stallscope import __version__
from stallscope.cli.flags import add_common_flags
from stallscope.errors import StallscopeError
from stallscope.tfimport import import_tensorflow

# (name, module, one-line help). Modules are imported to register their flags; they keep
# TensorFlow imports inside `run`, so `--help` stays fast.
SUBCOMMANDS = (
    ("prepare", "stallscope.cli.prepare", "prepare image data: ILSVRC2012 validation set or the built-in data set"),
    ("convert", "stallscope.cli.convert", "convert image folders to verified, sharded TFRecords"),
    ("verify", "stallscope.cli.verify", "re-read TFRecords and name any damaged shard, record and byte"),
    ("train", "stallscope.cli.train", "fine-tune a model from JPEG files or TFRecords, measuring input wait"),
    ("evaluate", "stallscope.cli.evaluate", "top-1/top-5 accuracy of a checkpoint, once or on every new one"),
    ("analyze", "stallscope.cli.analyze", "diagnose a run or a profile: input share, bottleneck stage, fix"),
    ("capture", "stallscope.cli.capture", "attach to a running job's profiler server: capture a profile and diagnose it"),
    ("diagnose", "stallscope.cli.diagnose", "differential stall analysis by short probes; --fix applies the advice"),
    ("serve", "stallscope.cli.serve", "run the tf.data service (dispatcher, workers) to decode on other processes or hosts"),
)
NEEDS_TENSORFLOW = frozenset({"verify", "train", "evaluate", "analyze", "diagnose", "serve"})


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print one line naming the flag, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="stallscope",
        description="Find, explain and remove input-pipeline stalls in TensorFlow fine-tuning.",
        epilog="Run `stallscope COMMAND --help` for the flags of one command.",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    for name, module_name, help_text in SUBCOMMANDS:
        module = importlib.import_module(module_name)
        command = sub.add_parser(
            name, help=help_text, description=(module.__doc__ or help_text).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_common_flags(command)
        module.add_parser(command)
        command.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command in NEEDS_TENSORFLOW:
            import_tensorflow()
        return int(args.handler(args) or 0)
    except StallscopeError as exc:
        if args.debug:
            raise
        print(f"stallscope {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"stallscope {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
