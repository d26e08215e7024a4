"""A sweep's grid: its axes (format x latency x pipeline x accelerator x learning rate), the settings
every cell shares, and the cells it spans. Pure: parsing, naming and comparing, no running.

A grid is saved into the sweep folder (sweep.json) so that a resumed sweep can prove it is the same
experiment; `differences` names what changed when it is not.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

from stallscope.errors import UsageError
from stallscope.pipeline.presets import PRESETS
from stallscope.pipeline.sources import SOURCE_KINDS
from stallscope.workload.accelerator import parse_accelerator

LOCAL = "local"
_LATENCY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(us|ms|s)?\s*", re.I)
_LATENCY_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def split_list(flag: str, text: str) -> list[str]:
    """'a,b' -> ['a', 'b']; an empty item or a repeated one is refused (a repeat would double a cell)."""
    items = [item.strip() for item in str(text).split(",")]
    if any(not item for item in items):
        raise UsageError(f"{flag}: expected a comma-separated list without empty items, got {text!r}")
    seen: set[str] = set()
    for item in items:
        if item in seen:
            raise UsageError(f"{flag}: expected each value once, got {item!r} twice in {text!r}")
        seen.add(item)
    return items


def parse_latency(text: str) -> str:
    """'local' (the folder on local disk) or a per-request latency of an emulated store, normalised to
    its milliseconds ('10ms', '0.5ms'); a bare number is milliseconds."""
    if text.strip().lower() == LOCAL:
        return LOCAL
    match = _LATENCY.fullmatch(text)
    if not match:
        raise UsageError(f"--latency: expected 'local' or a per-request latency such as 0ms, 10ms or 0.03s, "
                         f"got {text!r}")
    seconds = float(match.group(1)) * _LATENCY_UNIT_S[(match.group(2) or "ms").lower()]
    return f"{seconds * 1000:g}ms"


def latency_seconds(latency: str) -> float | None:
    """None for local disk, else the per-request latency in seconds."""
    return None if latency == LOCAL else float(latency.removesuffix("ms")) / 1000.0


def parse_learning_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--learning-rate: expected positive numbers such as 1e-4,1e-3, got {text!r}") from None
    if not value > 0:
        raise UsageError(f"--learning-rate: expected positive numbers such as 1e-4,1e-3, got {text!r}")
    return value


def parse_accelerator_axis(text: str) -> str:
    """The spelling kept for one accelerator value ('real', 'emulated:500', 'emulated:15ms')."""
    try:
        parse_accelerator(text)
    except UsageError as exc:
        raise UsageError(f"--accelerator: {str(exc).split(': ', 1)[-1]}") from None
    return text.strip().lower()


def _unique(flag: str, values: list[Any], texts: list[str]) -> None:
    """Two spellings of one value (10ms and 0.01s) would make the same cell twice."""
    seen: dict[Any, str] = {}
    for value, text in zip(values, texts):
        if value in seen:
            raise UsageError(f"{flag}: expected each value once, got {seen[value]!r} and {text!r} for the same value")
        seen[value] = text


@dataclasses.dataclass(frozen=True)
class Axes:
    """The values each axis takes; every combination is one cell."""

    formats: tuple[str, ...] = ("files",)
    latencies: tuple[str, ...] = (LOCAL,)
    pipelines: tuple[str, ...] = ("tuned",)
    accelerators: tuple[str, ...] = ("real",)
    learning_rates: tuple[float, ...] = (1e-4,)

    def __post_init__(self) -> None:
        for name in ("formats", "latencies", "pipelines", "accelerators", "learning_rates"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not getattr(self, name):
                raise UsageError(f"{name}: expected at least one value, got none")
        for value in self.formats:
            if value not in SOURCE_KINDS:
                raise UsageError(f"--format: expected files or records, got {value!r}")
        for value in self.pipelines:
            if value not in PRESETS:
                raise UsageError(f"--pipeline: expected presets from {', '.join(sorted(PRESETS))}, got {value!r}")

    @classmethod
    def parse(cls, *, formats: str, latencies: str, pipelines: str, accelerators: str,
              learning_rates: str) -> "Axes":
        """From the flags' comma-separated texts; every bad value is named with its flag."""
        latency_texts = split_list("--latency", latencies)
        parsed_latencies = [parse_latency(t) for t in latency_texts]
        _unique("--latency", parsed_latencies, latency_texts)
        lr_texts = split_list("--learning-rate", learning_rates)
        parsed_lrs = [parse_learning_rate(t) for t in lr_texts]
        _unique("--learning-rate", parsed_lrs, lr_texts)
        accelerator_texts = split_list("--accelerator", accelerators)
        parsed_accelerators = [parse_accelerator_axis(t) for t in accelerator_texts]
        _unique("--accelerator", [parse_accelerator(a) for a in parsed_accelerators], accelerator_texts)
        return cls(formats=tuple(split_list("--format", formats)), latencies=tuple(parsed_latencies),
                   pipelines=tuple(split_list("--pipeline", pipelines)), accelerators=tuple(parsed_accelerators),
                   learning_rates=tuple(parsed_lrs))


@dataclasses.dataclass(frozen=True)
class Cell:
    """One combination of the axes: one `stallscope train` configuration, run `repeats` times."""

    format: str
    latency: str
    pipeline: str
    accelerator: str
    learning_rate: float

    @property
    def name(self) -> str:
        """A folder name that reads as the cell: files-local-seed-emulated_500-lr0.0001."""
        text = f"{self.format}-{self.latency}-{self.pipeline}-{self.accelerator}-lr{self.learning_rate:g}"
        return re.sub(r"[^A-Za-z0-9.+-]", "_", text)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Grid:
    """The whole experiment: axes, repeats, and what every cell shares (data, steps, knobs, model)."""

    axes: Axes
    repeats: int
    shared: dict[str, Any]  # JSON-ready settings every cell runs with (data path, steps, knob overrides, ...)

    def __post_init__(self) -> None:
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise UsageError(f"--repeats: expected a positive integer, got {self.repeats!r}")

    def cells(self) -> list[Cell]:
        """Every cell, storage-latency-major so that cells sharing an emulated store run together."""
        a = self.axes
        return [Cell(fmt, latency, pipeline, accelerator, lr) for latency, fmt, pipeline, accelerator, lr
                in itertools.product(a.latencies, a.formats, a.pipelines, a.accelerators, a.learning_rates)]

    def to_dict(self) -> dict[str, Any]:
        return {"axes": {k: list(v) for k, v in dataclasses.asdict(self.axes).items()},
                "repeats": self.repeats, "shared": self.shared}


def differences(saved: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """'pipelines: seed,tuned -> seed' for each setting that differs between two saved grids."""
    def flat(grid: dict[str, Any]) -> dict[str, Any]:
        out = {f"{k}": v for k, v in grid.get("axes", {}).items()}
        out["repeats"] = grid.get("repeats")
        out.update({k: v for k, v in grid.get("shared", {}).items()})
        return out

    def show(value: Any) -> str:
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) \
            if isinstance(value, list) else str(value)

    old, new = flat(saved), flat(wanted)
    return [f"{key}: {show(old.get(key))} -> {show(new.get(key))}"
            for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
