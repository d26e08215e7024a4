"""Validation helpers shared by the frozen option dataclasses of every module.

Each helper raises UsageError naming the field and the value received, the way Keras and
tensorflow/datasets word their errors, so a bad option never reaches TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stallscope.errors import UsageError

AUTOTUNE = -1  # the value of tf.data.AUTOTUNE, kept here so options import without TensorFlow


def usable_cores() -> int:
    """Cores this process may keep busy: its CPU affinity (taskset, a container's cpuset) under its
    cgroup's CPU quota (a container's or pod's CPU limit), rounded up; what a `workers=None` option
    means by "every core"."""
    from stallscope.cpu_limits import current

    return current().whole_cores


def require_positive(name: str, value: Any, *, allow_none: bool = False, allow_autotune: bool = False) -> None:
    if value is None and allow_none:
        return
    if allow_autotune and value == AUTOTUNE:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        allowed = "a positive integer"
        if allow_autotune:
            allowed += " or 'autotune'"
        if allow_none:
            allowed += " or none"
        raise UsageError(f"{name}: expected {allowed}, got {value!r}")


def require_non_negative(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UsageError(f"{name}: expected a number >= 0, got {value!r}")


def require_choice(name: str, value: Any, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise UsageError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")


def why_not_writable(folder: Path) -> str:
    """'' when `folder` exists and can be written, or can be made (`mkdir -p`); otherwise why not.
    Checked when a folder is given, so a run does not fail at its first write with an OS error."""
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p.is_symlink())
    if not existing.is_dir():
        return f"{str(existing)!r} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{str(existing)!r} cannot be written"
    return ""


def require_folder_to_write(name: str, value: Any) -> Path:
    """`value` as a Path, once known to be a folder that exists and can be written, or can be made."""
    if not isinstance(value, (str, os.PathLike)):
        raise UsageError(f"{name}: expected a folder to write into, got {type(value).__name__} {value!r}")
    path = Path(value)
    why = "a file is there" if path.exists() and not path.is_dir() else why_not_writable(path)
    if why:
        raise UsageError(f"{name}: expected a folder to write into, got {os.fspath(value)!r} ({why})")
    return path


def to_dict(options: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (possibly nested) options dataclass; tuples become lists."""
    return json_ready(dataclasses.asdict(options))


def json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if hasattr(value, "__fspath__"):
        return str(value)
    return value


def from_dict(cls: type, data: dict[str, Any], *, source: str) -> Any:
    """Builds options from a dict (a saved JSON file), rejecting unknown keys by name."""
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise UsageError(f"{source}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return cls(**values)
