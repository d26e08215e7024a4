"""Flag helpers shared by the subcommands.

Every flag is spelled `--kebab-case` and also accepts the seeds' `--snake_case` spelling, in both
`--name=value` and `--name value` forms (argparse gives the latter two for free).
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from stallscope.config import AUTOTUNE, why_not_writable

if TYPE_CHECKING:
    from stallscope.storage.stuck_calls import StuckCallWatch

DEFAULT_PRESET = "tuned"  # --pipeline's default

_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2,
               "mib": 1024**2, "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


def add_flag(parser: argparse._ActionsContainer, name: str, *extra: str, **kwargs) -> argparse.Action:
    """Adds `--name` in kebab case plus its snake-case alias (and any extra spellings)."""
    kebab = name.replace("_", "-")
    snake = name.replace("-", "_")
    spellings = [f"--{kebab}"] + ([f"--{snake}"] if snake != kebab else []) + list(extra)
    kwargs.setdefault("dest", snake)
    return parser.add_argument(*spellings, **kwargs)


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """--debug and -v on a subcommand (or a subcommand's kind). Their default is left unset, so a flag
    given before the subcommand is not reset by the subcommand's parser."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log progress details")


# argparse's own wordings, turned into "expected ..., got ..."
_ARGPARSE_NAMED = re.compile(r"argument (\S+): (.*)", re.S)
_OUR_NAMED = re.compile(r"(-{0,2}[A-Za-z][A-Za-z0-9_-]*): (.*)", re.S)
_REQUIRED = re.compile(r"the following arguments are required: (.*)", re.S)
_INVALID_CHOICE = re.compile(r"invalid choice: (.*) \(choose from (.*)\)", re.S)
_INVALID_TYPE = re.compile(r"invalid (\w+) value: (.*)", re.S)
_TYPE_WORDS = {"int": "an integer", "float": "a number"}


def spelled_as_typed(message: str, parser: argparse.ArgumentParser, typed: list[str]) -> str:
    """`--flag: expected ..., got ...` with the flag spelled as the user typed it (kebab or snake case).

    Rewrites argparse's `argument --a-b/--a_b: ...` and an option's `a_b: ...` (a dataclass field that
    a flag sets); a message about anything the user did not type is left as it is."""
    required = _REQUIRED.fullmatch(message)
    if required:
        names = [name.split("/")[0] for name in required.group(1).split(", ")]
        return f"{', '.join(names)}: expected {'this flag' if len(names) == 1 else 'these flags'}, got nothing"
    match = _ARGPARSE_NAMED.fullmatch(message)
    if match:
        spellings, rest = match.group(1).split("/"), _plain_argparse(match.group(2))
        if not spellings[0].startswith("-"):  # a positional argument, named by its metavar
            return f"{match.group(1)}: {rest}"
        return f"{_typed_spelling(spellings, typed) or spellings[0]}: {rest}"
    match = _OUR_NAMED.fullmatch(message)
    if not match:
        return message
    name, rest = match.groups()
    spellings = _spellings(parser, name)
    typed_name = _typed_spelling(spellings, typed) if spellings else None
    return f"{typed_name}: {rest}" if typed_name else message


def _plain_argparse(text: str) -> str:
    choice = _INVALID_CHOICE.fullmatch(text)
    if choice:
        return f"expected one of {choice.group(2).replace(chr(39), '')}, got {choice.group(1)}"
    kind = _INVALID_TYPE.fullmatch(text)
    if kind:
        return f"expected {_TYPE_WORDS.get(kind.group(1), kind.group(1))}, got {kind.group(2)}"
    if text == "expected one argument":
        return "expected a value, got nothing"
    if text.startswith("ignored explicit argument "):
        return f"expected no value, got {text[len('ignored explicit argument '):]}"
    return text


def _normal(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def _spellings(parser: argparse.ArgumentParser, name: str) -> list[str]:
    """The option strings of the flag that sets `name` (its dest, or a pipeline knob's field)."""
    wanted = _normal(name)
    for action in parser._actions:
        if action.option_strings and wanted in (action.dest, action.dest.removeprefix("knob_"),
                                                *(_normal(s) for s in action.option_strings)):
            return list(action.option_strings)
    return []


def _typed_spelling(spellings: list[str], typed: list[str]) -> str | None:
    """The spelling among `spellings` the user typed (`--a_b` or `--a_b=1`); None if none was typed."""
    for token in typed:
        if token.split("=", 1)[0] in spellings:
            return token.split("=", 1)[0]
    return None


def _type_error(expected: str, text: str, why: str = "") -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}, got {text!r}" + (f" ({why})" if why else ""))


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _type_error("a positive integer", text) from None
    if value <= 0:
        raise _type_error("a positive integer", text)
    return value


def jpeg_quality(text: str) -> int | str:
    """'keep' (a JPEG source's own quality) or an integer quality in 1..100."""
    if text.strip().lower() == "keep":
        return "keep"
    try:
        value = int(text)
    except ValueError:
        raise _type_error("'keep' or a JPEG quality in 1..100", text) from None
    if not 1 <= value <= 100:
        raise _type_error("'keep' or a JPEG quality in 1..100", text)
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _type_error("an integer >= 0", text) from None
    if value < 0:
        raise _type_error("an integer >= 0", text)
    return value


def count_or_auto(text: str) -> int | None:
    """'auto' (None: the tool decides) or an integer >= 0."""
    if text.strip().lower() == "auto":
        return None
    try:
        return non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise _type_error("'auto' or an integer >= 0", text) from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _type_error("a positive number", text) from None
    if not value > 0:
        raise _type_error("a positive number", text)
    return value


def link_bandwidth(text: str) -> float:
    """A network link's bandwidth in Gbit/s: 10Gbit/s, 25Gbit, 1250MB/s."""
    from stallscope.analysis.service_sizing import parse_link_gbps

    try:
        return parse_link_gbps(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {exc}") from None


def core_count(text: str) -> float:
    """A number of cores above 0 (fractions for a CPU quota): 8, 0.5."""
    try:
        value = float(text)
    except ValueError:
        raise _type_error("a number of cores above 0 such as 8", text) from None
    if not 0 < value < float("inf"):
        raise _type_error("a number of cores above 0 such as 8", text)
    return value


def add_service_flags(parser: argparse.ArgumentParser) -> None:
    """--service-link and --service-worker-cores: what the tf.data service's sizing cannot measure."""
    from stallscope.analysis.service_sizing import DEFAULT_LINK_GBPS

    group = parser.add_argument_group("tf.data service sizing (where the input is CPU-bound)")
    add_flag(group, "service_link", type=link_bandwidth, default=None, metavar="BANDWIDTH",
             help=f"the network between the service's workers and this trainer, e.g. 10Gbit/s, 25Gbit or 1250MB/s "
                  f"(default: assumed {DEFAULT_LINK_GBPS:g} Gbit/s)")
    add_flag(group, "service_worker_cores", type=core_count, default=None, metavar="N",
             help="the cores of each service worker (default: assumed as this host's free cores)")


def service_from_args(args: argparse.Namespace):
    """The ServiceAssumptions the service flags gave (None each where assumed)."""
    from stallscope.analysis.service_sizing import ServiceAssumptions

    return ServiceAssumptions(link_gbps=getattr(args, "service_link", None),
                              worker_cores=getattr(args, "service_worker_cores", None))


def int_or_autotune(text: str) -> int:
    """A tf.data parallelism or buffer knob: a positive integer or 'autotune'."""
    if text.strip().lower() in {"autotune", "auto", "-1"}:
        return AUTOTUNE
    try:
        value = int(text)
    except ValueError:
        raise _type_error("a positive integer or 'autotune'", text) from None
    if value <= 0:
        raise _type_error("a positive integer or 'autotune'", text)
    return value


_SECONDS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """Seconds, plain (30) or with a unit: 30s, 500ms, 2m, 1h."""
    match = re.fullmatch(r"\s*(-?[0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SECONDS:
        raise _type_error("a duration such as 30s, 500ms or 2m", text)
    value = float(match.group(1)) * _SECONDS[unit]
    if not value > 0:
        raise _type_error("a duration above 0", text)
    return value


def precision(text: str) -> float:
    """--precision: a share such as 5% or 0.05."""
    from stallscope.errors import UsageError
    from stallscope.workload.precision import parse_precision

    try:
        return parse_precision(text)
    except UsageError:
        raise argparse.ArgumentTypeError(f"expected a share such as 5% or 0.05, got {text!r}") from None


def add_precision_flags(group: argparse._ActionsContainer, *, each: str, instead: str, reported: str) -> None:
    """--precision, --min-seconds and --max-seconds, one meaning wherever a measurement runs to a
    precision (train, sweep, diagnose): `each` names what is measured ("each run"), `instead` the flag
    that fixes its length otherwise, `reported` where the precision reached is stated."""
    from stallscope.workload.precision import DEFAULT_MAX_SECONDS, DEFAULT_MIN_SECONDS

    add_flag(group, "precision", type=precision, default=None, metavar="PCT",
             help=f"run {each} until the images/s of its measured steps' two halves agree within PCT, e.g. 5%%, "
                  f"after at least --min-seconds of measured steps; at most --max-seconds (not with {instead}, "
                  f"which fixes the length; {reported})")
    add_flag(group, "min_seconds", type=duration, default=DEFAULT_MIN_SECONDS, metavar="DURATION",
             help=f"with --precision: measure {each} at least this long (default: {DEFAULT_MIN_SECONDS:g}s)")
    add_flag(group, "max_seconds", type=duration, default=DEFAULT_MAX_SECONDS, metavar="DURATION",
             help=f"with --precision: stop {each} after this long measured even if not that precise, saying so "
                  f"(default: {DEFAULT_MAX_SECONDS:g}s)")


def byte_size(text: str) -> int:
    """Bytes as a plain integer (seed-000's 52428800) or with a unit: 50M, 64MiB, 1.5G."""
    match = re.fullmatch(r"\s*(-?[0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise _type_error("a size in bytes such as 52428800, 50M or 64MiB", text)
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise _type_error("a size above 0 bytes", text)
    return value


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise _type_error("an existing directory", text, "it does not exist")
    if not path.is_dir():
        raise _type_error("a directory", text, "a file")
    return path


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise _type_error("an existing file", text, "it does not exist")
    if not path.is_file():
        raise _type_error("a file", text, _not_a_file(path))
    return path


def _not_a_file(path: Path) -> str:
    """What stands at `path` instead of a regular file, as the user would name it."""
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        return "a directory"
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a pipe"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def existing_path(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise _type_error("an existing path", text, "it does not exist")
    return path


def creatable_dir(text: str) -> Path:
    """A folder to write into: one that exists, or one `mkdir -p` can make. Checked when the flag is
    read, so a run does not fail at its first write, minutes in, with a file-system traceback."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise _type_error("a folder to write into", text, "a file is there")
    why = why_not_writable(path)
    if why:
        raise _type_error("a folder to write into", text, why)
    return path


def creatable_file(text: str) -> Path:
    """A file to write: not a folder, in a folder that exists or can be made."""
    path = Path(text)
    if path.is_dir():
        raise _type_error("a file to write", text, "a folder is there")
    why = why_not_writable(path.parent)
    if why:
        raise _type_error("a file to write", text, why)
    return path


def data_location(text: str):
    """A local path, gs://bucket/prefix or s3://bucket/prefix (a store is checked when it is opened)."""
    from stallscope.errors import UsageError
    from stallscope.storage.location import as_path

    try:
        return as_path(text)
    except UsageError:
        raise _type_error("a local path, gs://bucket/prefix or s3://bucket/prefix", text) from None


def existing_dir_or_url(text: str):
    """An existing local directory, or a gs:// or s3:// location (checked when it is opened)."""
    from stallscope.storage.location import is_remote

    return data_location(text) if is_remote(text) else existing_dir(text)


def add_storage_flag(parser: argparse._ActionsContainer) -> None:
    """--storage-timeout: how long a gs:// or s3:// request may wait, and how long a listing, a read or
    a write on a network file system may go without progress."""
    from stallscope.storage.location import DEFAULT_TIMEOUT_S

    add_flag(parser, "storage_timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
             help=f"connect/read timeout of gs:// and s3:// requests; on a network file system (NFS, SMB, FUSE), "
                  f"how long a listing, a read or the writing of convert's, prepare's or verify's files may go "
                  f"without progress (default: {DEFAULT_TIMEOUT_S:.0f})")


def _records_streamed_by_stallscope(args: argparse.Namespace) -> bool:
    """Records that stallscope's reader streams through Python: from s3://, and from gs:// where the
    pipeline reads it with the pooled reader (the `tuned` preset, `--gcs-reader pooled`)."""
    if getattr(args, "source", None) != "records":
        return False
    named = [str(v) for v in vars(args).values()]
    if any(v.startswith("s3://") for v in named):
        return True
    if not any(v.startswith("gs://") for v in named) or not hasattr(args, "pipeline"):
        return False
    from stallscope.storage import gcs_obstore

    return pipeline_from_args(args).gcs_reader == "pooled" and gcs_obstore.available()


def pipeline_from_args(args: argparse.Namespace):
    """The preset (or --pipeline-config file) with the knob flags the user gave applied."""
    import dataclasses

    from stallscope.errors import UsageError
    from stallscope.pipeline.config import PipelineConfig
    from stallscope.pipeline.presets import apply_overrides, get_preset

    if args.pipeline is not None and args.pipeline_config is not None:
        raise UsageError("--pipeline-config: give either --pipeline PRESET or --pipeline-config FILE, not both")
    base = PipelineConfig.load(args.pipeline_config) if args.pipeline_config is not None \
        else get_preset(args.pipeline or DEFAULT_PRESET)
    return apply_overrides(base, {field.name: getattr(args, f"knob_{field.name}", None)
                                  for field in dataclasses.fields(PipelineConfig)})


def apply_storage_flags(args: argparse.Namespace) -> list[str]:
    """Before TensorFlow loads: the storage timeout, malloc's heap padding for records stallscope's
    reader streams, and TF's gs:// settings when a flag names gs:// (TF reads them once, at load). A
    JPEG tree (`--source files`, `convert`) gets a small read block. Returns the gs:// settings made,
    as NAME=value."""
    from stallscope.storage.gcs_store import prepare_gcs_environment
    from stallscope.storage.location import is_remote, set_timeout, storage_timeout

    timeout = getattr(args, "storage_timeout", None)
    if timeout is not None:
        set_timeout(timeout)
    if _records_streamed_by_stallscope(args):
        from stallscope.storage.heap_padding import pad_heaps

        # Records streamed through Python: malloc keeps freed memory (see heap_padding). Padded only
        # when the pipeline was built, gs:// records took 27 minor faults per image against 13 (s3://).
        pad_heaps()
    named_gs = any(is_remote(v) and str(v).startswith("gs://") for v in vars(args).values())
    if not named_gs:
        return []
    small_objects = getattr(args, "source", None) == "files" or getattr(args, "command", None) == "convert"
    return prepare_gcs_environment(storage_timeout(), small_objects=small_objects)


def network_roots(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, real path) of each local path a command was given that is on a network file system."""
    from stallscope.storage.location import is_remote
    from stallscope.storage.mounts import network_file_system

    roots = []
    for dest, value in vars(args).items():
        if isinstance(value, (str, os.PathLike)) and not is_remote(value) and (
                isinstance(value, Path) or os.path.exists(value)) and network_file_system(value):
            roots.append((f"--{dest.replace('_', '-')}", os.path.realpath(value)))
    return roots


def watch_network_file_calls(args: argparse.Namespace, give_up: Callable[[str], None]) -> StuckCallWatch | None:
    """Where a command reads or writes on a network file system, a watch on the file calls TF makes
    there itself: one that has not answered for the storage timeout goes to `give_up(message)`, which
    must end the process (the call's thread cannot be stopped). None where there is nothing to watch."""
    from stallscope.storage.location import storage_timeout
    from stallscope.storage.mounts import is_within
    from stallscope.storage.stuck_calls import StuckCallWatch

    roots = network_roots(args)
    if not roots or not StuckCallWatch.available():
        return None

    def on_stuck(stuck) -> None:
        flag = next((flag for flag, root in roots if is_within(stuck.path, root)), "")
        give_up(stuck.message(storage_timeout(), flag))

    return StuckCallWatch(storage_timeout(), on_stuck, fallback=roots[0][1]).start()
