"""seed-004's four questions, each answered yes/no/unknown with the evidence behind the answer."""

from __future__ import annotations

import dataclasses
from typing import Any

from stallscope.analysis.cpu_window import CpuWindow
from stallscope.analysis.fetch_wait import others_fill_the_cores, others_text
from stallscope.analysis.steps import StepBreakdown
from stallscope.analysis.tfdata import StageTree
from stallscope.cpu_limits import cpu_named, quota_limited, quota_throttled
from stallscope.verdict import MODERATELY_INPUT_BOUND, fmt_share

SLOW_GET_NEXT_US = 50.0        # seed-004: IteratorGetNext returning within 50 us means data was ready
CPU_SATURATED_PERCENT = 90.0   # all cores this busy on average leaves the pipeline no room to grow
ANSWERS = ("yes", "no", "unknown")


@dataclasses.dataclass(frozen=True)
class CheckItem:
    key: str          # get_next_slow, prefetch_at_end, cpu_saturated, bottleneck
    question: str
    answer: str       # yes / no / unknown; for `bottleneck` the stage name, "none" when the input keeps up,
                      # "unknown" when the share was not measured
    evidence: str
    needs_action: bool


def checklist(steps: StepBreakdown, tree: StageTree, resources: dict[str, Any] | None,
              window: CpuWindow | None = None) -> tuple[CheckItem, ...]:
    """`window`: the CPU over the training steps (cpu_window), which saturation is judged on where known."""
    return (
        _get_next(steps),
        _prefetch(tree),
        _cpu(resources, window),
        _bottleneck(tree, steps),
    )


def input_bound(steps: StepBreakdown) -> bool:
    """The verdict's test: input wait is at least XProf's 'moderately' share of step time (False when
    the share was not measured: the verdict is then unknown, not 'not')."""
    return steps.input_share is not None and steps.input_share >= MODERATELY_INPUT_BOUND


def between_steps_text(steps: StepBreakdown) -> str:
    """'5 calls, waiting 81.8 ms before each step on average (96.0% of the time from one step's end to
    the next's)': the iterator's calls outside the step markers, where a loop fetches before the step opens."""
    between = steps.between
    if between is None:
        return ""
    if between.share is None:
        return fmt_calls(between.calls)
    return (f"{fmt_calls(between.calls)}, waiting {between.wait_ms.mean:.1f} ms before each step on average "
            f"({fmt_share(between.share)} of the time from one step's end to the next's)")


def not_measured_text(steps: StepBreakdown, *, detail: bool = True) -> str:
    """Why a profile's steps give no input share: an iterator outside them, or none at all."""
    if steps.between is not None:
        where = "no IteratorGetNext inside the step markers; it runs between them"
        return f"{where}: {between_steps_text(steps)}" if detail else where
    return "no IteratorGetNext in the profiled steps"


def _get_next(steps: StepBreakdown) -> CheckItem:
    """Judged by the wait's share of step time, the verdict's own threshold, so the two never
    disagree; seed-004's 50 us per call is quoted beside it. A 100 us call before a 10 ms step is
    above 50 us yet costs 1% of the step: not slow in any sense that matters."""
    question = "Is IteratorGetNext slow?"
    if steps.input_share is None:
        return CheckItem("get_next_slow", question, "unknown", not_measured_text(steps), needs_action=False)
    mean, share = steps.get_next_mean_us, steps.input_share
    slow = input_bound(steps)
    per_call = (f"{mean:.0f} us per call over {fmt_calls(steps.get_next_calls)} "
                f"({'above' if mean > SLOW_GET_NEXT_US else 'within'} seed-004's {SLOW_GET_NEXT_US:.0f} us)")
    threshold = f"input-bound from {MODERATELY_INPUT_BOUND:.0%}"
    if slow:
        evidence = f"the wait is {fmt_share(share)} of step time ({threshold}); {per_call}"
    elif mean > SLOW_GET_NEXT_US:
        evidence = (f"{per_call}, but the wait is only {fmt_share(share)} of step time ({threshold}): "
                    "too little to matter")
    else:
        evidence = f"the wait is {fmt_share(share)} of step time ({threshold}); {per_call}"
    return CheckItem("get_next_slow", question, "yes" if slow else "no", evidence, needs_action=slow)


def fmt_calls(count: int) -> str:
    return "1 call" if count == 1 else f"{count} calls"


def _prefetch(tree: StageTree) -> CheckItem:
    """A prefetch, or any asynchronous stage at the end (MapAndBatch, ParallelMap, ParallelBatch): it
    makes the next batch on its own threads while the step runs, which is what a prefetch adds."""
    question = "Is there a prefetch at the end?"
    outer = tree.outermost
    if outer is None:
        return CheckItem("prefetch_at_end", question, "unknown", "the profile has no Iterator:: events",
                         needs_action=False)
    evidence = f"the outermost stage below the iterator's root is {outer.name} ({' -> '.join(tree.chain())})"
    if outer.name.startswith(("Prefetch", "LegacyPrefetch")):
        return CheckItem("prefetch_at_end", question, "yes", evidence, needs_action=False)
    if outer.asynchronous:
        return CheckItem("prefetch_at_end", question, "yes", f"{evidence}: asynchronous, it makes the next batch "
                         "on its own threads while the step runs, as a prefetch would", needs_action=False)
    return CheckItem("prefetch_at_end", question, "no", evidence, needs_action=True)


BARE_PROFILE_CPU = ("only a bare profile was given: CPU use is sampled into resources.json beside it by StallMonitor "
                    "(Keras fit), stallscope.profile (a custom loop) or `stallscope train`; TensorBoard's "
                    "profile_batch alone records none")


def _cpu(resources: dict[str, Any] | None, window: CpuWindow | None = None) -> CheckItem:
    """Judged over the training steps where the samples and steps.csv allow (the whole run's mean
    includes start-up and validation), else over the whole run."""
    question = "Is the CPU saturated?"
    cpu = (resources or {}).get("cpu") if isinstance(resources, dict) else None
    if not isinstance(cpu, dict) or not isinstance(cpu.get("system_mean_percent"), (int, float)):
        reason = BARE_PROFILE_CPU if resources is None else "resources.json has no CPU samples"
        return CheckItem("cpu_saturated", question, "unknown", reason, needs_action=False)
    if cpu.get("samples") == 0 and not quota_limited(cpu.get("throttled_share")):
        # a run shorter than half a sampling interval: its mean of 0% is no figure (a quota's counters are)
        duration = cpu.get("duration_s")
        took = f"the run took {duration:.2f} s, " if isinstance(duration, (int, float)) else ""
        return CheckItem("cpu_saturated", question, "unknown", f"no CPU samples: {took}less than one sampling "
                         "interval", needs_action=False)
    run_mean = float(cpu["system_mean_percent"])
    run_peak = float(cpu.get("system_max_percent", run_mean))
    if window is not None:
        mean = window.mean_percent
        saturated = mean >= CPU_SATURATED_PERCENT
        evidence = (f"the {cpu_named(cpu)} were {mean:.0f}% busy on average over the training steps (peak "
                    f"{window.max_percent:.0f}%, {_samples(window.samples)} from {window.start_s:.1f} s to "
                    f"{window.end_s:.1f} s{_own_share(window)}); {run_mean:.0f}% over the whole run, start-up and "
                    f"validation included; saturated at {CPU_SATURATED_PERCENT:.0f}%")
    else:
        saturated = run_mean >= CPU_SATURATED_PERCENT
        evidence = (f"the {cpu_named(cpu)} were {run_mean:.0f}% busy on average (peak {run_peak:.0f}%) over "
                    f"{_samples(cpu.get('samples'))} of the whole run (no steps.csv to judge the training steps "
                    f"alone); saturated at {CPU_SATURATED_PERCENT:.0f}%")
    needs_action = saturated
    if saturated and others_fill_the_cores(window):
        evidence += f"; {others_text(window)}"
        needs_action = False  # nothing in this pipeline to change for other processes' load
    if quota_limited(cpu.get("throttled_share")):
        saturated = needs_action = True  # the quota ran out in many periods: saturated whatever the mean says
        evidence += f"; {quota_throttled(cpu)}"
    return CheckItem("cpu_saturated", question, "yes" if saturated else "no", evidence, needs_action=needs_action)


def _own_share(window: CpuWindow) -> str:
    """', this process 1.1 cores of them': where other processes kept the cores busy, it shows."""
    if window.process_cores is None:
        return ""
    return f", this process {window.process_cores:.1f} core{'' if round(window.process_cores, 1) == 1 else 's'} of them"


def _samples(count) -> str:
    return "1 sample" if count == 1 else f"{count if count is not None else '?'} samples"


def _bottleneck(tree: StageTree, steps: StepBreakdown) -> CheckItem:
    """The walk's stage limits the run only when the run waits for input; otherwise it is just the
    slowest stage, named without alarm. Without a measured share neither is known."""
    stage = tree.bottleneck_stage
    if stage is None:
        return CheckItem("bottleneck", "Which stage is the bottleneck?", "unknown", tree.reason, needs_action=False)
    walk = " -> ".join(name.rsplit("::", 1)[-1] for name in tree.walk)
    if input_bound(steps):
        return CheckItem("bottleneck", "Which stage is the bottleneck?", stage.name,
                         f"walked {walk}: {tree.reason}", needs_action=True)
    if steps.input_share is None:
        return CheckItem("bottleneck", "Which stage is the bottleneck?", "unknown",
                         f"whether the input keeps up is not measured ({not_measured_text(steps, detail=False)}), "
                         f"so neither is whether a stage holds the run back; the slowest is {stage.name} "
                         f"(walked {walk}: {tree.reason})", needs_action=False)
    return CheckItem("bottleneck", "Which stage is the bottleneck?", "none",
                     f"the input keeps up ({fmt_share(steps.input_share)} of step time), so no stage holds the run "
                     f"back; the slowest is {stage.name} (walked {walk}: {tree.reason})", needs_action=False)
