"""How busy the CPU was while the training steps ran, from resources.json's samples and steps.csv.

A run's whole-run CPU mean includes its start-up (building the model, the first batches, tracing)
and its validation, often single-threaded: a 2-core Keras fit read 69% busy over the run and 90%
over its training steps. Saturation is judged over the steps, where the pipeline competes with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from stallscope.workload.rundir import StepRecord
from stallscope.workload.timing import measured_steps


@dataclasses.dataclass(frozen=True)
class CpuWindow:
    """The CPU samples whose interval's middle falls within the training steps (seconds on the run's
    clock: steps.csv's `started_s`, which the samples' `elapsed_s` share to within a sample); pauses
    between steps longer than a sample (validation) are left out. start_s/end_s: the first and last step."""

    mean_percent: float      # the CPU the run may use, 100 = all of it busy (by anyone)
    max_percent: float
    samples: int
    start_s: float
    end_s: float
    cores: float | None      # resources.json's cores (affinity under the quota)
    process_cores: float | None = None   # cores this process itself kept busy on average (the rest: other processes)


def cpu_over_steps(resources: dict[str, Any] | None, records: Sequence[StepRecord]) -> CpuWindow | None:
    """The CPU over the training steps; None without samples or steps, or when no sample falls in them."""
    if not isinstance(resources, dict) or not records:
        return None
    samples = resources.get("samples")
    interval = resources.get("interval_s")
    if not isinstance(samples, list) or not isinstance(interval, (int, float)) or interval <= 0:
        return None
    train = measured_steps([r for r in records if r.phase == "train"] or list(records))
    spans = training_spans(train, gap_s=interval)
    start, end = spans[0][0], spans[-1][1]
    chosen = [s for s in samples
              if isinstance(s, dict) and isinstance(s.get("elapsed_s"), (int, float))
              and isinstance(s.get("system_percent"), (int, float))
              and any(a <= s["elapsed_s"] - interval / 2 <= b for a, b in spans)]
    if not chosen:
        return None
    inside = [s["system_percent"] for s in chosen]
    own = [s["process_percent"] for s in chosen if isinstance(s.get("process_percent"), (int, float))]
    cores = resources.get("cores")
    return CpuWindow(mean_percent=sum(inside) / len(inside), max_percent=max(inside), samples=len(inside),
                     start_s=start, end_s=end, cores=float(cores) if isinstance(cores, (int, float)) else None,
                     process_cores=sum(own) / len(own) / 100.0 if len(own) == len(chosen) else None)


def training_spans(steps: Sequence[StepRecord], *, gap_s: float) -> list[tuple[float, float]]:
    """The steps' time as spans (seconds), steps closer than `gap_s` joined: a pause longer than a sample
    between two steps (an epoch's validation, a checkpoint) is left out."""
    spans: list[list[float]] = []
    for step in sorted(steps, key=lambda r: r.started_s):
        begin, finish = step.started_s, step.started_s + step.step_ms / 1000.0
        if spans and begin - spans[-1][1] < gap_s:
            spans[-1][1] = max(spans[-1][1], finish)
        else:
            spans.append([begin, finish])
    return [(a, b) for a, b in spans]


def idle_cores(window: CpuWindow | None, saturated: bool) -> float | None:
    """Cores left idle over the steps, which more parallelism could use: none where the CPU is saturated
    (the last few percent are scheduling gaps, not room); None where not measured."""
    if window is None or window.cores is None:
        return None
    if saturated:
        return 0.0
    return max(0.0, window.cores * (1.0 - window.mean_percent / 100.0))
