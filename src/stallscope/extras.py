"""The optional parts of stallscope and the one line that names the extra a missing package is in.

Why: `pip install stallscope` installs only what the API, `analyze`, `capture`, `diagnose`, `train` and
`convert` need; plots, the built-in data set, ImageNet sorting, object stores, the storage emulator,
Beam and TensorBoard's Profile tab (xprof) are extras (pyproject.toml). A feature whose extra is missing says which
`pip install` adds it, as a StallscopeError: the CLI prints it as its one-line error, exit code 2.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

from stallscope.errors import StallscopeError

# extra -> what it is for (the message says it). Keep in step with [project.optional-dependencies].
EXTRAS = {
    "cpu": "TensorFlow (CPU build)",
    "data": "the built-in data set",
    "demo": "the demo",
    "imagenet": "the ILSVRC2012 ground truth",
    "report": "plots in HTML reports",
    "xprof": "TensorBoard's Profile tab and analyze's cross-check with it",
    "stores": "s3:// and pooled gs:// readers",
    "s3fs": "s3:// read through s3fs (STALLSCOPE_S3_READER=s3fs)",
    "emulator": "the storage emulator",
    "beam": "Apache Beam",
}


class MissingExtra(StallscopeError):
    """An optional package is not installed; the message names the extra that installs it."""


def install_line(extra: str) -> str:
    """`pip install "stallscope[EXTRA]"`, the command a message quotes."""
    if extra not in EXTRAS:
        raise ValueError(f"extra: expected one of {sorted(EXTRAS)}, got {extra!r}")
    return f'pip install "stallscope[{extra}]"'


def missing_extra(extra: str, feature: str, package: str) -> MissingExtra:
    """The error for `feature` needing `package`, which the `extra` extra installs."""
    return MissingExtra(f"{feature} needs {package}, which is not installed ({EXTRAS[extra]}): {install_line(extra)}")


@contextlib.contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    """`with needs_extra("report", "--html"): import matplotlib` turns a missing package into the one line."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise missing_extra(extra, feature, (exc.name or str(exc)).split(".")[0]) from None


def installed(*modules: str) -> bool:
    """True where every module can be imported (found, not loaded: no import cost)."""
    return all(importlib.util.find_spec(module) is not None for module in modules)


def require(extra: str, feature: str, *modules: str) -> None:
    """Before any work (and before worker processes, whose failed start a pool retries for ever): the
    one line where a module of `extra` is not installed."""
    for module in modules:
        if not installed(module):
            raise missing_extra(extra, feature, module)
