"""Per-step breakdown from a profile's step markers: step time, input wait, compute, input share.

Definition, aligned with XProf's Input Pipeline Analyzer (TensorBoard's Profile tab) so the two agree:
- steps come from `stepfinder` (step markers of any name, Keras' spans or calls, a custom loop's
  step-function calls); a step's time is its span;
- XProf drops the first and the last marked step of a capture (they may be cut by the capture
  window); so do we: they are listed but not `counted`;
- input wait is the time inside `IteratorGetNext*::DoCompute` events on the host that fall in the
  step (XProf's "Input" category on a CPU-only host, where there is no infeed), overlaps merged;
- compute is the rest of the step;
- the input share is total input wait / total step time over the counted steps (XProf's
  "x% of the total step time sampled is waiting for input"), not the mean of per-step shares;
- steps that hold no IteratorGetNext have no measured share and no verdict (None): a loop fed NumPy
  arrays, or `for x in dataset: with step(i): ...`, whose `for` fetches the batch before the step
  opens. In the latter the calls fall between the steps; `BetweenSteps` measures them there.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stallscope.analysis.stepfinder import FoundSteps, StepSpan, find_steps
from stallscope.analysis.xplane import Event, Profile, ps_to_ms
from stallscope.extras import install_line
from stallscope.tfimport import stderr_fd_silenced
from stallscope.verdict import verdict_for
from stallscope.workload.rundir import StepRecord
from stallscope.workload.timing import measured_steps, percentile

log = logging.getLogger(__name__)

GET_NEXT_EVENTS = ("IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute")


@dataclasses.dataclass(frozen=True)
class StepTiming:
    step: int
    name: str
    start_ms: float       # from the first step's start
    step_ms: float
    input_ms: float
    compute_ms: float
    get_next_calls: int
    counted: bool         # False for the first and last marked step, as XProf


@dataclasses.dataclass(frozen=True)
class Spread:
    """Mean, median, 90th percentile and standard deviation of one per-step figure (ms)."""

    mean: float
    p50: float
    p90: float
    std: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        if not values:
            return cls(0.0, 0.0, 0.0, 0.0)
        ordered = sorted(values)
        mean = sum(ordered) / len(ordered)
        std = math.sqrt(sum((v - mean) ** 2 for v in ordered) / len(ordered))
        return cls(mean=mean, p50=percentile(ordered, 50), p90=percentile(ordered, 90), std=std)


@dataclasses.dataclass(frozen=True)
class BetweenSteps:
    """IteratorGetNext calls outside the step markers, where a loop fetches its batch before the step
    opens. `wait_ms` is per counted step: the calls' time in the gap before it; `share` is that wait
    over the time from the previous step's end to this one's (the gap plus the step)."""

    calls: int            # GetNext calls that start outside every step span
    wait_ms: Spread       # per counted step with a step before it
    gap_ms: Spread        # the gap before each of those steps
    share: float | None   # total wait / total (gap + step); None without a gap to measure


@dataclasses.dataclass(frozen=True)
class StepBreakdown:
    steps: tuple[StepTiming, ...]
    step_ms: Spread
    input_ms: Spread
    compute_ms: Spread
    input_share: float | None   # 0..1; None when no step holds an IteratorGetNext (not measured)
    verdict: str | None         # None with the share
    get_next_mean_us: float   # mean IteratorGetNext duration over counted steps (seed-004's 50 us test)
    get_next_calls: int
    method: str = "step markers"    # how the steps were found (stepfinder)
    batches_per_step: int = 1         # >1 under Keras' steps_per_execution: one step runs that many batches
    between: BetweenSteps | None = None   # with no share: GetNext calls outside the steps; else None

    @property
    def has_iterator(self) -> bool:
        """False when no step waited on a tf.data iterator (input fed as NumPy arrays, say)."""
        return any(s.get_next_calls for s in self.steps)

    @property
    def counted_steps(self) -> int:
        return sum(1 for s in self.steps if s.counted)


@dataclasses.dataclass(frozen=True)
class RunTiming:
    """The run's own wall-clock timing from steps.csv (every step, not only the profiled window). A
    program's own steps (StallMonitor: a Keras callback sees whole batches) have no input wait, so
    its split, share and verdict are None; images/s is None where no batch size was known."""

    steps: int
    step_ms: Spread
    input_ms: Spread | None
    compute_ms: Spread | None
    input_share: float | None
    verdict: str | None
    images_per_second: float | None


@dataclasses.dataclass(frozen=True)
class XprofFigure:
    """What TensorBoard's Input Pipeline Analyzer says about the same profile."""

    input_share: float | None   # None when xprof found no steps
    steps: int
    step_ms_mean: float | None
    conclusion: str
    error: str = ""


def step_breakdown(profile: Profile, found: FoundSteps | None = None) -> StepBreakdown:
    """Breakdown of the steps `stepfinder` finds (or `found`); DataError naming the file when none."""
    found = found or find_steps(profile)
    markers = found.spans
    get_next = sorted((e for e in profile.host.events() if e.name in GET_NEXT_EVENTS), key=lambda e: e.start_ps)
    origin = markers[0].start_ps
    timings, calls = [], []
    for index, marker in enumerate(markers):
        inside = _within(get_next, marker.start_ps, marker.end_ps)
        input_ps = _union_ps(inside, marker.start_ps, marker.end_ps)
        step_ms = ps_to_ms(marker.duration_ps)
        input_ms = ps_to_ms(input_ps)
        timings.append(StepTiming(
            step=marker.number, name=marker.name, start_ms=ps_to_ms(marker.start_ps - origin),
            step_ms=step_ms, input_ms=input_ms, compute_ms=max(step_ms - input_ms, 0.0),
            get_next_calls=len(inside), counted=0 < index < len(markers) - 1 or len(markers) < 3,
        ))
        if timings[-1].counted:
            calls.extend(inside)
    counted = [t for t in timings if t.counted]
    total_step = sum(t.step_ms for t in counted)
    share = sum(t.input_ms for t in counted) / total_step if total_step > 0 else 0.0
    if not any(t.get_next_calls for t in timings):
        share = None  # no step waited on an iterator: the wait is not in the steps, not zero
    mean_us = sum(e.duration_ps for e in calls) / len(calls) / 1e6 if calls else 0.0
    return StepBreakdown(
        steps=tuple(timings),
        step_ms=Spread.of([t.step_ms for t in counted]),
        input_ms=Spread.of([t.input_ms for t in counted]),
        compute_ms=Spread.of([t.compute_ms for t in counted]),
        input_share=share, verdict=None if share is None else verdict_for(share),
        get_next_mean_us=mean_us, get_next_calls=len(calls), method=found.method,
        batches_per_step=found.batches_per_step or calls_per_step(counted),
        between=between_steps(markers, get_next, timings) if share is None else None,
    )


def calls_per_step(timings: Sequence[StepTiming]) -> int:
    """The usual number of iterator calls in a step that made any: the batches a step runs where its
    span carries no step number to read them from (a call of Keras' train function under
    steps_per_execution fetches each of its batches inside the call)."""
    calls = Counter(t.get_next_calls for t in timings if t.get_next_calls)
    return calls.most_common(1)[0][0] if calls else 1


def between_steps(markers: Sequence[StepSpan], get_next: Sequence[Event],
                  timings: Sequence[StepTiming]) -> BetweenSteps | None:
    """GetNext calls outside the step spans, and their time in the gap before each counted step
    (from the previous step's end to this one's start); None when every call is inside a step."""
    inside = sum(t.get_next_calls for t in timings)
    if len(get_next) <= inside:
        return None
    waits, gaps, cycles = [], [], []
    for index in range(1, len(markers)):
        if not timings[index].counted:
            continue
        start, end = markers[index - 1].end_ps, markers[index].start_ps
        if end <= start:
            continue  # steps that touch or overlap leave no gap
        waits.append(ps_to_ms(_union_ps(_overlapping(get_next, start, end), start, end)))
        gaps.append(ps_to_ms(end - start))
        cycles.append(gaps[-1] + timings[index].step_ms)
    return BetweenSteps(calls=len(get_next) - inside, wait_ms=Spread.of(waits), gap_ms=Spread.of(gaps),
                        share=sum(waits) / sum(cycles) if sum(cycles) > 0 else None)


def run_timing(records: Sequence[StepRecord]) -> RunTiming | None:
    """Summary of steps.csv without warm-up steps; None when the run has no measured step."""
    measured = measured_steps(records)
    if not measured:
        return None
    total_step = sum(r.step_ms for r in measured)
    images = sum(r.images for r in measured) if all(r.images is not None for r in measured) else 0
    rate = images / (total_step / 1000.0) if total_step > 0 and images > 0 else None  # None: images not known
    step = Spread.of([r.step_ms for r in measured])
    if any(math.isnan(r.input_wait_ms) or math.isnan(r.compute_ms) for r in measured):
        return RunTiming(steps=len(measured), step_ms=step, input_ms=None, compute_ms=None, input_share=None,
                         verdict=None, images_per_second=rate)
    share = sum(r.input_wait_ms for r in measured) / total_step if total_step > 0 else 0.0
    return RunTiming(
        steps=len(measured), step_ms=step,
        input_ms=Spread.of([r.input_wait_ms for r in measured]),
        compute_ms=Spread.of([r.compute_ms for r in measured]),
        input_share=share, verdict=verdict_for(share), images_per_second=rate,
    )


def xprof_figure(profile_path: Path) -> XprofFigure:
    """Runs XProf's Input Pipeline Analyzer offline on the profile and reads its step table.

    The share is computed from its per-step rows (sum of "Input" / sum of "Step time"), which is
    the figure its conclusion rounds to one decimal.
    """
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError:
        return XprofFigure(None, 0, None, "", error=f"xprof is not installed: {install_line('xprof')}")
    try:
        with stderr_fd_silenced():  # xprof's C++ converter logs a dozen INFO lines to fd 2 per call
            raw = raw_to_tool_data.xspace_to_tool_data([str(profile_path)], "input_pipeline_analyzer", {})
        data = json.loads(raw[0] if isinstance(raw, tuple) else raw)
        return _read_xprof_tables(data)
    except Exception as exc:  # xprof's converter raises anything from C++; keep the analysis going
        log.warning("xprof could not analyse %s: %s", profile_path, exc)
        return XprofFigure(None, 0, None, "", error=f"xprof failed: {exc}")


def _read_xprof_tables(data: Any) -> XprofFigure:
    table = next((t for t in data if any(c.get("id") == "infeedTimeMs" for c in t.get("cols", []))), None)
    if table is None:
        return XprofFigure(None, 0, None, "", error="xprof returned no step-time table")
    column = {c["id"]: i for i, c in enumerate(table["cols"])}
    steps = [row["c"][column["stepTimeMs"]]["v"] for row in table["rows"]]
    inputs = [row["c"][column["infeedTimeMs"]]["v"] for row in table["rows"]]
    conclusion = table.get("p", {}).get("input_conclusion", "")
    if not steps or sum(steps) <= 0:
        return XprofFigure(None, 0, None, conclusion)
    return XprofFigure(
        input_share=sum(inputs) / sum(steps), steps=len(steps),
        step_ms_mean=sum(steps) / len(steps), conclusion=conclusion,
    )


def _within(events: Sequence[Event], start_ps: int, end_ps: int) -> list[Event]:
    """Events (sorted by start) that start inside [start, end)."""
    first = bisect.bisect_left(events, start_ps, key=lambda e: e.start_ps)
    last = bisect.bisect_left(events, end_ps, key=lambda e: e.start_ps)
    return list(events[first:last])


def _overlapping(events: Sequence[Event], start_ps: int, end_ps: int) -> list[Event]:
    """Events that overlap [start, end): a call may start just before a gap (a step's end) and run into it."""
    return [e for e in events if e.start_ps < end_ps and e.end_ps > start_ps]


def _union_ps(events: Sequence[Event], start_ps: int, end_ps: int) -> int:
    """Length of the union of the events' intervals clipped to [start, end] (nested calls count once)."""
    total, reach = 0, start_ps
    for event in sorted(events, key=lambda e: e.start_ps):
        begin, end = max(event.start_ps, reach), min(event.end_ps, end_ps)
        if end > begin:
            total += end - begin
            reach = end
    return total
