"""How far a run's images/s can be trusted: the agreement of its two halves, and running until they agree.

A measurement of ~1 s (368 images) gave 291 images/s in one run and 651 in the next: buffers filling,
a cache warming and the machine's other work all move a short window. The measured (non-warm-up) steps
are cut in two at the middle of their time; the images/s of the first half and of the second must agree
within a tolerance before the mean says anything. That catches noise and drift alike (a cold first
epoch followed by a warm one disagrees with itself however long it runs).

`PrecisionTarget` runs a measurement until its halves agree within `tolerance` after at least
`min_seconds` of measured steps, or gives up at `max_seconds`; `measure_precision` says what a
finished run reached and whether it is too short to trust.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from stallscope.errors import UsageError
from stallscope.workload.rundir import StepRecord

# Below this much measured time, or this many measured steps in a half, a run's images/s is flagged.
SHORT_RUN_S = 5.0
MIN_STEPS_PER_HALF = 4
# Without a target, halves further apart than this are flagged.
DEFAULT_TOLERANCE = 0.10
DEFAULT_MIN_SECONDS = 5.0
DEFAULT_MAX_SECONDS = 300.0


@dataclasses.dataclass(frozen=True)
class PrecisionTarget:
    """Run until the images/s of the measured steps' two halves differ by at most `tolerance` (0.05:
    5% of their mean), after at least `min_seconds` of measured steps; stop at `max_seconds` anyway."""

    tolerance: float
    min_seconds: float = DEFAULT_MIN_SECONDS
    max_seconds: float = DEFAULT_MAX_SECONDS

    def __post_init__(self) -> None:
        if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float)) \
                or not 0 < self.tolerance < 1:
            raise UsageError(f"precision: expected a share between 0 and 1 (e.g. 0.05 or 5%), got {self.tolerance!r}")
        for name in ("min_seconds", "max_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
                raise UsageError(f"{name}: expected seconds >= 0, got {value!r}")
        if self.max_seconds < self.min_seconds:
            raise UsageError(f"max_seconds: expected at least min_seconds ({self.min_seconds:g}), "
                             f"got {self.max_seconds!r}")

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def parse_precision(text: str) -> float:
    """'5%' or '0.05' -> 0.05; one line naming what was expected otherwise."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"--precision: expected a share such as 5% or 0.05, got {text!r}") from None
    if not 0 < value < 1:
        raise UsageError(f"--precision: expected a share between 0 and 100% (e.g. 5%), got {text!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Precision:
    """What a run's measured steps say of their own precision.

    halves_images_per_second: images/s of the first and second half of the measured time (None with
        fewer than MIN_STEPS_PER_HALF steps a half). spread: their difference over their mean (0.05:
        5%), the run's precision. measured_s: time of the measured steps. target: the tolerance asked
        for (None: none asked); reached: spread within it (or within DEFAULT_TOLERANCE without one).
    stopped_by: what ended the run: "precision", "max_seconds", "steps", "epochs" or "interrupted".
    warning: why the figure is not to be trusted, in words; None where it is.
    """

    halves_images_per_second: tuple[float, float] | None
    spread: float | None
    measured_s: float
    measured_steps: int
    target: float | None
    reached: bool
    stopped_by: str
    warning: str | None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["halves_images_per_second"] = list(self.halves_images_per_second) if self.halves_images_per_second else None
        return data


def _measured(steps: Sequence[StepRecord]) -> list[StepRecord]:
    return [s for s in steps if not s.warmup]


# A step at least this many times the median step, holding at least this share of the measured time,
# starts a cycle (a buffer filling again: a shuffle taking in a pass over the data, a cache refilling).
SPIKE_FACTOR = 5.0
SPIKE_SHARE = 0.05
# Where such steps hold at least this share of the measured time, the halves are of whole cycles.
CYCLE_BOUND_SHARE = 0.5


def _rate(part: Sequence[StepRecord]) -> float:
    ms = sum(s.step_ms for s in part)
    return sum(s.images for s in part) / (ms / 1000.0) if ms > 0 else 0.0


def cycle_starts(steps: Sequence[StepRecord]) -> list[int] | None:
    """Indexes (into the measured steps) of the long steps that start each cycle, where such steps hold
    most of the measured time; None where the time is spread over the steps as usual."""
    measured = _measured(steps)
    times = [s.step_ms for s in measured]
    total = sum(times)
    if not times or total <= 0:
        return None
    typical = sorted(times)[len(times) // 2]
    starts = [i for i, t in enumerate(times) if t >= SPIKE_FACTOR * typical and t >= SPIKE_SHARE * total]
    if sum(times[i] for i in starts) < CYCLE_BOUND_SHARE * total:
        return None
    return starts


def halves(steps: Sequence[StepRecord]) -> tuple[float, float] | None:
    """Images/s of the measured steps before and after the middle of their time; None when a half has
    fewer than MIN_STEPS_PER_HALF steps. Where a few long steps hold most of the time (a pass's shuffle
    refilling from storage, then its batches from the buffer), a cut in the middle of the time leaves
    one more long step on one side whenever their number is odd, and the halves disagree however long
    the run: the halves are then of whole cycles (a long step up to the next), the first half of the
    whole cycles against the last half (the middle one left out where their number is odd); None with
    fewer than two whole cycles."""
    measured = _measured(steps)
    total_ms = sum(s.step_ms for s in measured)
    if len(measured) < 2 * MIN_STEPS_PER_HALF or total_ms <= 0:
        return None
    starts = cycle_starts(steps)
    if starts is not None:
        cycles = [measured[a:b] for a, b in zip(starts, starts[1:])]
        if len(cycles) < 2:
            return None
        count = len(cycles) // 2
        return (_rate([s for cycle in cycles[:count] for s in cycle]),
                _rate([s for cycle in cycles[-count:] for s in cycle]))
    elapsed, cut = 0.0, len(measured)
    for index, record in enumerate(measured):
        if elapsed + record.step_ms / 2 >= total_ms / 2:
            cut = index
            break
        elapsed += record.step_ms
    first, second = measured[:cut], measured[cut:]
    if len(first) < MIN_STEPS_PER_HALF or len(second) < MIN_STEPS_PER_HALF:
        return None
    return _rate(first), _rate(second)


def spread_of(pair: tuple[float, float] | None) -> float | None:
    """|a - b| / mean(a, b); None without two halves."""
    if pair is None or sum(pair) <= 0:
        return None
    return abs(pair[0] - pair[1]) / (sum(pair) / 2)


def measured_seconds(steps: Sequence[StepRecord]) -> float:
    return sum(s.step_ms for s in _measured(steps)) / 1000.0


def target_met(steps: Sequence[StepRecord], target: PrecisionTarget) -> str | None:
    """'precision' once the halves agree within the target after its minimum time, 'max_seconds' once
    the measured time passes its maximum, else None (keep going)."""
    seconds = measured_seconds(steps)
    if seconds >= target.max_seconds:
        return "max_seconds"
    if seconds < target.min_seconds:
        return None
    spread = spread_of(halves(steps))
    return "precision" if spread is not None and spread <= target.tolerance else None


def measure_precision(steps: Sequence[StepRecord], *, target: PrecisionTarget | None, stopped_by: str) -> Precision:
    """The precision a finished run reached, and a warning where its images/s is not to be trusted."""
    pair = halves(steps)
    spread = spread_of(pair)
    seconds = measured_seconds(steps)
    tolerance = target.tolerance if target is not None else DEFAULT_TOLERANCE
    reached = spread is not None and spread <= tolerance
    problems = []
    measured = _measured(steps)
    starts = cycle_starts(steps)
    if pair is None and starts is not None and len(measured) >= 2 * MIN_STEPS_PER_HALF:
        long_s = sum(measured[i].step_ms for i in starts) / 1000.0
        problems.append(f"{len(starts)} long step(s) of its {len(measured)} measured hold {long_s / seconds:.0%} of "
                        f"the measured time ({long_s:.1f} s: a buffer filling again, such as a shuffle taking in a "
                        "pass over the data), and two halves of whole cycles between them need at least 3")
    elif pair is None:
        problems.append(f"{len(measured)} measured step(s) are too few to compare two halves "
                        f"(at least {2 * MIN_STEPS_PER_HALF})")
    elif not reached:
        problems.append(f"the images/s of its halves, {pair[0]:,.0f} and {pair[1]:,.0f}, differ by {spread:.0%} "
                        f"(more than {tolerance:.0%})")
    if seconds < SHORT_RUN_S and (target is None or stopped_by != "precision"):
        problems.append(f"{seconds:.2f} s measured is under {SHORT_RUN_S:g} s")
    warning = None
    if problems:
        advice = ("; raise --max-seconds or loosen --precision" if target is not None
                  else "; run longer, e.g. --precision 5% (runs until its halves agree within 5%)")
        warning = "too short to trust: " + "; ".join(problems) + advice
    return Precision(halves_images_per_second=pair, spread=spread, measured_s=seconds,
                     measured_steps=len(_measured(steps)), target=target.tolerance if target else None,
                     reached=reached, stopped_by=stopped_by, warning=warning)
