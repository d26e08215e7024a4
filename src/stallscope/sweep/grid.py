"""A sweep's grid: its axes (format x store x latency x bandwidth x pipeline x accelerator x learning
rate), the settings every cell shares, and the cells it spans. Pure: parsing, naming and comparing, no
running. Local disk is a store of its own: one cell per other combination, no latency or bandwidth.

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
from stallscope.sweep.figures import EMULATED_STORES, LOCAL, STORES, Cell
from stallscope.workload.accelerator import parse_accelerator

__all__ = ["LOCAL", "Axes", "Cell", "Grid", "differences", "latency_seconds", "parse_bandwidth", "parse_latency"]

_LATENCY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(us|ms|s)?\s*", re.I)
_LATENCY_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_BANDWIDTH = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(bit|kbit|mbit|gbit|b|kb|mb|gb)(?:/s|ps)?\s*", re.I)
_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "b": 8, "kb": 8e3, "mb": 8e6, "gb": 8e9}
UNCAPPED = "none"


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


def parse_bandwidth(text: str) -> float | None:
    """Bits per second of an emulated store's shared cap: 200Mbit, 1Gbit, 25MB (bytes, x8); 'none': no cap."""
    if text.strip().lower() == UNCAPPED:
        return None
    match = _BANDWIDTH.fullmatch(text)
    if not match or not float(match.group(1)) > 0:
        raise UsageError(f"--bandwidth: expected bandwidths such as 200Mbit, 1Gbit, 25MB or none, got {text!r}")
    return float(match.group(1)) * _BITS[match.group(2).lower()]


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
    """The values each axis takes; every combination is one cell (the local store's cells have no
    latency or bandwidth, so those two axes multiply only the emulated stores)."""

    formats: tuple[str, ...] = ("files",)
    stores: tuple[str, ...] = (LOCAL,)
    latencies: tuple[str, ...] = ()                 # per-request latencies of the emulated stores ('10ms')
    bandwidths: tuple[float | None, ...] = (None,)  # their caps in bits/s; None: uncapped
    pipelines: tuple[str, ...] = ("tuned",)
    accelerators: tuple[str, ...] = ("real",)
    learning_rates: tuple[float, ...] = (1e-4,)

    def __post_init__(self) -> None:
        for name in ("formats", "stores", "latencies", "bandwidths", "pipelines", "accelerators", "learning_rates"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not getattr(self, name) and name != "latencies":
                raise UsageError(f"{name}: expected at least one value, got none")
        for value in self.formats:
            if value not in SOURCE_KINDS:
                raise UsageError(f"--format: expected files or records, got {value!r}")
        for value in self.stores:
            if value not in STORES:
                raise UsageError(f"--store: expected stores from {', '.join(STORES)}, got {value!r}")
        for value in self.pipelines:
            if value not in PRESETS:
                raise UsageError(f"--pipeline: expected presets from {', '.join(sorted(PRESETS))}, got {value!r}")
        emulated = [store for store in self.stores if store != LOCAL]
        if emulated and not self.latencies:
            raise UsageError(f"--store: {emulated[0]} is an emulated store, which needs a per-request --latency "
                             f"such as 0ms or 10ms beside it, got --latency local")
        if self.latencies and not emulated:
            raise UsageError(f"--latency: {self.latencies[0]} applies to an emulated store; expected --store "
                             f"{', '.join(EMULATED_STORES)} beside it, got --store local")
        if self.bandwidths != (None,) and not emulated:
            raise UsageError("--bandwidth: applies to an emulated store, which only a --latency other than local "
                             "starts; expected a --store such as gcs or s3 beside it")

    @classmethod
    def parse(cls, *, formats: str, latencies: str, pipelines: str, accelerators: str, learning_rates: str,
              stores: str | None = None, bandwidths: str | None = None) -> "Axes":
        """From the flags' comma-separated texts; every bad value is named with its flag. 'local' among
        the latencies is the local store (as before the store axis); without --store, a latency other
        than local is an emulated gs:// store."""
        latency_texts = split_list("--latency", latencies)
        parsed_latencies = [parse_latency(t) for t in latency_texts]
        _unique("--latency", parsed_latencies, latency_texts)
        remote = [latency for latency in parsed_latencies if latency != LOCAL]
        if stores is None:
            store_list = ([LOCAL] if LOCAL in parsed_latencies else []) + (["gcs"] if remote else [])
        else:
            store_list = [store.lower() for store in split_list("--store", stores)]
            if LOCAL in parsed_latencies and LOCAL not in store_list:
                store_list.insert(0, LOCAL)
        bandwidth_texts = split_list("--bandwidth", bandwidths) if bandwidths is not None else [UNCAPPED]
        parsed_bandwidths = [parse_bandwidth(t) for t in bandwidth_texts]
        _unique("--bandwidth", parsed_bandwidths, bandwidth_texts)
        lr_texts = split_list("--learning-rate", learning_rates)
        parsed_lrs = [parse_learning_rate(t) for t in lr_texts]
        _unique("--learning-rate", parsed_lrs, lr_texts)
        accelerator_texts = split_list("--accelerator", accelerators)
        parsed_accelerators = [parse_accelerator_axis(t) for t in accelerator_texts]
        _unique("--accelerator", [parse_accelerator(a) for a in parsed_accelerators], accelerator_texts)
        return cls(formats=tuple(split_list("--format", formats)), stores=tuple(store_list),
                   latencies=tuple(remote), bandwidths=tuple(parsed_bandwidths),
                   pipelines=tuple(split_list("--pipeline", pipelines)), accelerators=tuple(parsed_accelerators),
                   learning_rates=tuple(parsed_lrs))

    @property
    def emulated(self) -> list[str]:
        """The emulated stores among the stores (none: every cell reads local disk)."""
        return [store for store in self.stores if store != LOCAL]


@dataclasses.dataclass(frozen=True)
class Grid:
    """The whole experiment: axes, repeats, and what every cell shares (data, steps, knobs, model)."""

    axes: Axes
    repeats: int
    shared: dict[str, Any]  # JSON-ready settings every cell runs with (data path, steps, knob overrides, ...);
                            # `cold` and `precision` only where asked (so earlier sweeps' grids still match)

    def __post_init__(self) -> None:
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise UsageError(f"--repeats: expected a positive integer, got {self.repeats!r}")

    def cells(self) -> list[Cell]:
        """Every cell, store-major then latency and bandwidth: local disk's cells first, then each emulated
        store's (a fresh store per run either way). A cold grid's cells are cold cells, named apart."""
        a, cold = self.axes, bool(self.shared.get("cold"))
        cells = []
        for store in a.stores:
            where = [(LOCAL, None)] if store == LOCAL else list(itertools.product(a.latencies, a.bandwidths))
            cells += [Cell(format=fmt, store=store, latency=latency, pipeline=pipeline, accelerator=accelerator,
                           learning_rate=lr, bandwidth_bps=bandwidth, cold=cold)
                      for (latency, bandwidth), fmt, pipeline, accelerator, lr
                      in itertools.product(where, a.formats, a.pipelines, a.accelerators, a.learning_rates)]
        return cells

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
