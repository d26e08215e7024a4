"""The `stallscope` console script: dispatches to one module per subcommand."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import re
import sys

from stallscope.version import __version__
from stallscope.cli.flags import add_common_flags, apply_storage_flags, spelled_as_typed, watch_network_file_calls
from stallscope.cli.signals import sigterm_as_interrupt
from stallscope.errors import StallscopeError
from stallscope.tfimport import freeze_collector_after_import, import_tensorflow, own_autograph_folder_after_import

# (name, module, one-line help). Modules are imported to register their flags; they keep
# TensorFlow imports inside `run`, so `--help` stays fast.
SUBCOMMANDS = (
    ("prepare", "stallscope.cli.prepare", "prepare image data: ILSVRC2012 validation or train set, or the built-in data set"),
    ("convert", "stallscope.cli.convert", "convert image folders to verified, sharded TFRecords"),
    ("verify", "stallscope.cli.verify", "re-read TFRecords and name any damaged shard, record and byte"),
    ("train", "stallscope.cli.train", "fine-tune a model from JPEG files or TFRecords, measuring input wait"),
    ("evaluate", "stallscope.cli.evaluate", "top-1/top-5 accuracy of a checkpoint, once or on every new one"),
    ("analyze", "stallscope.cli.analyze", "diagnose a run or a profile: input share, bottleneck stage, fix"),
    ("capture", "stallscope.cli.capture", "attach to a running job's profiler server: capture a profile and diagnose it"),
    ("diagnose", "stallscope.cli.diagnose", "differential stall analysis by short probes; --fix applies the advice"),
    ("sweep", "stallscope.cli.sweep", "run an experiment grid (format x latency x pipeline x accelerator x lr) with repeats"),
    ("serve", "stallscope.cli.serve", "run the tf.data service (dispatcher, workers) to decode on other processes or hosts"),
    ("storage", "stallscope.cli.storage", "emulate remote storage: a folder as a GCS or S3 bucket or a slow mount"),
)
# Commands imported TensorFlow up front (quietly, see tfimport). `analyze` reads a profile's protobuf
# without it and `verify --no-decode` only checksums, so both answer without TF's seconds of start-up.
NEEDS_TENSORFLOW = frozenset({"train", "evaluate", "diagnose", "serve"})
# Commands whose files TF itself reads or writes (a network file system's hang is in TF's threads there;
# convert, verify and prepare bound their own steps)
WATCHES_FILE_CALLS = frozenset({"train", "evaluate", "analyze", "diagnose"})


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print one line naming the flag as the user spelled
    it (`PROG: error: --flag: expected ..., got ...`), exit code 2."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # '-5M' or '-1' after a flag is its (bad) value for the flag's type to refuse, not an unknown option
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")
        self._typed: list[str] = []

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._typed = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {spelled_as_typed(message, self, self._typed)}\n")


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


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the subcommand (and of its kind, e.g. `serve worker`) that parsed `args`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return _command_parser(chosen, args)
    return parser


def _exit_now_if_a_store_hangs(code: int) -> None:
    """A request to a store that never answered still waits in a thread inside TF's or botocore's
    client; a normal exit would abort under it, so the process ends here, its output flushed."""
    from stallscope.storage.location import abandoned_requests

    if abandoned_requests():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def os_error_line(exc: OSError) -> str:
    """An error the operating system gave where no check of stallscope's came first, as one line naming
    the file: "'/data/run/steps.csv': No space left on device (the operating system refused; ...)"."""
    files = " -> ".join(repr(str(f)) for f in (exc.filename, exc.filename2) if f is not None)
    what = exc.strerror or str(exc) or type(exc).__name__
    return f"{files + ': ' if files else ''}{what} (the operating system refused; --debug shows where)"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    process_entry = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command that refused it, in the one format
        command = _command_parser(parser, args)
        token = unknown[0]
        command.error(f"{token}: expected a flag of `{command.prog}` (see --help), got an unknown flag"
                      if token.startswith("-") else f"{token}: expected no further argument, got {token!r}")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    watch = None

    def give_up(message: str) -> None:
        """A file call TF made on a network file system never came back: its thread cannot be stopped,
        so the process ends here, its output flushed, with the one line."""
        message = spelled_as_typed(message, _command_parser(parser, args), argv)
        sys.stdout.flush()
        print(f"stallscope {args.command}: error: {message}", file=sys.stderr, flush=True)
        os._exit(2)

    # The process's own entry: SIGTERM (a scheduler, `kill`) stops every command as Ctrl-C does, its
    # clean-up run, one line, exit 130. A caller running main(argv) keeps its own signal handling.
    stop_signals = sigterm_as_interrupt() if process_entry else contextlib.nullcontext()
    with stop_signals:
        try:
            apply_storage_flags(args)  # before TensorFlow loads: its gs:// client reads its settings once
            if args.command in WATCHES_FILE_CALLS and process_entry:
                watch = watch_network_file_calls(args, give_up)
            if process_entry:  # this process is stallscope's own: its collector may forget TF's import, and
                freeze_collector_after_import()  # autograph's generated files go into a folder it owns
                own_autograph_folder_after_import()
            if args.command in NEEDS_TENSORFLOW or (args.command == "verify" and not args.no_decode):
                import_tensorflow()
            return int(args.handler(args) or 0)
        except StallscopeError as exc:
            if args.debug:
                raise
            message = spelled_as_typed(str(exc), _command_parser(parser, args), argv)
            print(f"stallscope {args.command}: error: {message}", file=sys.stderr)
            if process_entry:  # not when a caller (a test, a script) runs main(argv) in its own process
                _exit_now_if_a_store_hangs(exc.exit_code)
            return exc.exit_code
        except OSError as exc:  # the surroundings refused (a folder that became unwritable, a full disk): one line
            if args.debug:
                raise
            print(f"stallscope {args.command}: error: {os_error_line(exc)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"stallscope {args.command}: interrupted", file=sys.stderr)
            return 130
        finally:
            if watch is not None:
                watch.stop()


if __name__ == "__main__":
    raise SystemExit(main())
