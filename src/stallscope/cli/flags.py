"""Flag helpers shared by the subcommands.

Every flag is spelled `--kebab-case` and also accepts the seeds' `--snake_case` spelling, in both
`--name=value` and `--name value` forms (argparse gives the latter two for free).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from stallscope.config import AUTOTUNE

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


def _type_error(expected: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")


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


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _type_error("a positive number", text) from None
    if not value > 0:
        raise _type_error("a positive number", text)
    return value


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


def byte_size(text: str) -> int:
    """Bytes as a plain integer (seed-000's 52428800) or with a unit: 50M, 64MiB, 1.5G."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
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
        raise argparse.ArgumentTypeError(f"directory {text!r} does not exist")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return path


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"file {text!r} does not exist")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    return path


def existing_path(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"path {text!r} does not exist")
    return path


_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """A time span in seconds: 5s, 500ms, 2m, 1h, or a plain number of seconds."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _TIME_UNITS:
        raise _type_error("a time such as 5s, 500ms or 2m", text)
    value = float(match.group(1)) * _TIME_UNITS[unit]
    if value <= 0:
        raise _type_error("a time above 0", text)
    return value
