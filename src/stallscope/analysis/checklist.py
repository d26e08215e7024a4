"""seed-004's four questions, each answered yes/no/unknown with the evidence behind the answer."""

from __future__ import annotations

import dataclasses
from typing import Any

from stallscope.analysis.steps import StepBreakdown
from stallscope.analysis.tfdata import StageTree

SLOW_GET_NEXT_US = 50.0        # seed-004: IteratorGetNext returning within 50 us means data was ready
CPU_SATURATED_PERCENT = 90.0   # all cores this busy on average leaves the pipeline no room to grow
ANSWERS = ("yes", "no", "unknown")


@dataclasses.dataclass(frozen=True)
class CheckItem:
    key: str          # get_next_slow, prefetch_at_end, cpu_saturated, bottleneck
    question: str
    answer: str       # yes / no / unknown, or the stage name for `bottleneck`
    evidence: str
    needs_action: bool


def checklist(steps: StepBreakdown, tree: StageTree, resources: dict[str, Any] | None) -> tuple[CheckItem, ...]:
    return (
        _get_next(steps),
        _prefetch(tree),
        _cpu(resources),
        _bottleneck(tree),
    )


def _get_next(steps: StepBreakdown) -> CheckItem:
    slow = steps.get_next_mean_us > SLOW_GET_NEXT_US
    evidence = (f"IteratorGetNext took {steps.get_next_mean_us:.0f} us on average over {steps.get_next_calls} calls "
                f"(threshold {SLOW_GET_NEXT_US:.0f} us); input wait is {steps.input_share:.1%} of step time")
    return CheckItem("get_next_slow", "Is IteratorGetNext slow (> 50 us)?", "yes" if slow else "no", evidence,
                     needs_action=slow)


def _prefetch(tree: StageTree) -> CheckItem:
    outer = tree.outermost
    if outer is None:
        return CheckItem("prefetch_at_end", "Is there a prefetch at the end?", "unknown",
                         "the profile has no Iterator:: events", needs_action=False)
    has = outer.name.startswith(("Prefetch", "LegacyPrefetch"))
    evidence = f"the outermost stage below the iterator's root is {outer.name} ({' -> '.join(tree.chain())})"
    return CheckItem("prefetch_at_end", "Is there a prefetch at the end?", "yes" if has else "no", evidence,
                     needs_action=not has)


def _cpu(resources: dict[str, Any] | None) -> CheckItem:
    question = "Is the CPU saturated?"
    cpu = (resources or {}).get("cpu") if isinstance(resources, dict) else None
    if not isinstance(cpu, dict) or not isinstance(cpu.get("system_mean_percent"), (int, float)):
        reason = ("only a bare profile was given: CPU use is sampled by `stallscope train` into the run's "
                  "resources.json" if resources is None else "resources.json has no CPU samples")
        return CheckItem("cpu_saturated", question, "unknown", reason, needs_action=False)
    mean = float(cpu["system_mean_percent"])
    peak = float(cpu.get("system_max_percent", mean))
    cores = cpu.get("cores", "?")
    saturated = mean >= CPU_SATURATED_PERCENT
    evidence = (f"all {cores} cores were {mean:.0f}% busy on average (peak {peak:.0f}%) over "
                f"{cpu.get('samples', '?')} samples; saturated at {CPU_SATURATED_PERCENT:.0f}%")
    return CheckItem("cpu_saturated", question, "yes" if saturated else "no", evidence, needs_action=saturated)


def _bottleneck(tree: StageTree) -> CheckItem:
    stage = tree.bottleneck_stage
    if stage is None:
        return CheckItem("bottleneck", "Which stage is the bottleneck?", "unknown", tree.reason, needs_action=False)
    walk = " -> ".join(name.rsplit("::", 1)[-1] for name in tree.walk)
    return CheckItem("bottleneck", "Which stage is the bottleneck?", stage.name,
                     f"walked {walk}: {tree.reason}", needs_action=True)
