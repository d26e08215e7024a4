"""Per-step timing: measuring (cheap clocks around get_next and the model step) and summarising.

Measuring and formatting are kept apart: `StepClock` takes the timestamps, `summarize_steps` turns
`StepRecord`s into a `StepStats`, and `format_step_line` renders seed-003's console line.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from stallscope.verdict import verdict_for
from stallscope.workload.resources import minor_faults
from stallscope.workload.rundir import StepRecord


class StepClock:
    """Three timestamps per step: start, batch received, step done (perf_counter, seconds), and the
    process's minor page faults from start to done."""

    def __init__(self, run_started: float | None = None) -> None:
        self.run_started = time.perf_counter() if run_started is None else run_started
        self.started = self.got_batch = self.done = 0.0
        self.faults_at_start = self.faults_at_done = None

    def start(self) -> None:
        self.started = time.perf_counter()
        self.faults_at_start = minor_faults()

    def batch_received(self) -> None:
        self.got_batch = time.perf_counter()

    def step_done(self) -> None:
        self.done = time.perf_counter()
        self.faults_at_done = minor_faults()

    def record(self, *, step: int, phase: str, images: int, warmup: bool) -> StepRecord:
        counted = self.faults_at_start is not None and self.faults_at_done is not None
        return StepRecord(
            step=step,
            phase=phase,
            started_s=round(self.started - self.run_started, 6),
            step_ms=(self.done - self.started) * 1000.0,
            input_wait_ms=(self.got_batch - self.started) * 1000.0,
            compute_ms=(self.done - self.got_batch) * 1000.0,
            images=images,
            warmup=warmup,
            minor_faults=self.faults_at_done - self.faults_at_start if counted else None,
        )


@dataclasses.dataclass(frozen=True)
class StepStats:
    """Means over the measured (non-warm-up) steps; input_share is input wait / step time (0..1)."""

    steps: int
    warmup_steps: int
    images: int
    images_per_second: float
    step_time_ms: float
    input_wait_ms: float
    compute_ms: float
    input_share: float
    verdict: str
    step_time_p50_ms: float
    step_time_p90_ms: float
    input_wait_p50_ms: float
    input_wait_p90_ms: float
    step_time_std_ms: float
    minor_faults_per_image: float | None = None  # None where a measured step has no count

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def measured_steps(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """The steps that count for means: all but warm-up, or every step when all were warm-up."""
    measured = [s for s in steps if not s.warmup]
    return measured or list(steps)


def faults_per_image(steps: Sequence[StepRecord]) -> float | None:
    """Minor page faults per image over `steps`; None unless every step has its count."""
    images = sum(s.images for s in steps)
    if not steps or images <= 0 or any(s.minor_faults is None for s in steps):
        return None
    return sum(s.minor_faults for s in steps) / images


def summarize_steps(steps: Sequence[StepRecord]) -> StepStats:
    measured = measured_steps(steps)
    count = len(measured)
    step_times = [s.step_ms for s in measured]
    waits = [s.input_wait_ms for s in measured]
    total_ms = sum(step_times)
    images = sum(s.images for s in measured)
    mean_step = total_ms / count if count else 0.0
    mean_wait = sum(waits) / count if count else 0.0
    share = min(1.0, max(0.0, mean_wait / mean_step)) if mean_step > 0 else 0.0
    variance = sum((t - mean_step) ** 2 for t in step_times) / count if count else 0.0
    return StepStats(
        steps=len(steps),
        warmup_steps=len(steps) - count,
        images=images,
        images_per_second=images / (total_ms / 1000.0) if total_ms > 0 else 0.0,
        step_time_ms=mean_step,
        input_wait_ms=mean_wait,
        compute_ms=sum(s.compute_ms for s in measured) / count if count else 0.0,
        input_share=share,
        verdict=verdict_for(share),
        step_time_p50_ms=percentile(step_times, 50),
        step_time_p90_ms=percentile(step_times, 90),
        input_wait_p50_ms=percentile(waits, 50),
        input_wait_p90_ms=percentile(waits, 90),
        step_time_std_ms=math.sqrt(variance),
        minor_faults_per_image=faults_per_image(measured),
    )


def format_step_line(step: int, window: Sequence[StepRecord], loss: float | None) -> str:
    """seed-003's line plus the input wait, averaged over the steps since the last line:
    `step 40, loss = 0.76 (39.6 examples/sec; 0.606 sec/batch; input wait 12.1 ms)`."""
    count = max(1, len(window))
    step_s = sum(s.step_ms for s in window) / count / 1000.0
    images = sum(s.images for s in window) / count
    wait_ms = sum(s.input_wait_ms for s in window) / count
    rate = images / step_s if step_s > 0 else 0.0
    loss_text = f", loss = {loss:.2f}" if loss is not None else ""
    return f"step {step}{loss_text} ({rate:.1f} examples/sec; {step_s:.3f} sec/batch; input wait {wait_ms:.1f} ms)"
