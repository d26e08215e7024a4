"""Turns any TF profile into steps, whatever marks them, so `steps.py` computes the breakdown alone.

Tried in this order, first that finds steps wins (what each writes was measured on TF 2.21 / Keras 3):
- step markers: events with a `step_num` stat and `_r=1`, of any name (`Trace('train', ...)`);
- Keras' `Profiled batch` spans: the TensorBoard callback writes one per batch of the profiled
  window, with `step_num` but no `_r`; they hold the `multi_step_on_iterator` call and only
  training batches (a validation phase inside the window has none);
- Keras' `multi_step_on_iterator` calls on the Python thread, one per call of the train function;
- a custom loop's step function: the most frequent top-level `tf.function` call on the Python
  thread (`tf_function_call` stat, e.g. `train_step`). Its step is the loop's iteration, from the
  end of one call to the end of the next, so the eager `next(iterator)` before it is in the step;
- an eager loop (no tf.function at all): the eager `next(iterator)` calls on the Python thread
  (`IteratorGetNextOp::DoCompute` there); a step runs from the start of one to the start of the next.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from stallscope.analysis.xplane import Event, Plane, Profile
from stallscope.errors import DataError

KERAS_BATCH = "Profiled batch"
KERAS_CALL = "multi_step_on_iterator"
PYTHON_LINE = "python"
EAGER_GET_NEXT = "IteratorGetNextOp::DoCompute"
MIN_CALLS = 3


@dataclasses.dataclass(frozen=True)
class StepSpan:
    name: str
    number: int
    start_ps: int
    end_ps: int

    @property
    def duration_ps(self) -> int:
        return self.end_ps - self.start_ps


@dataclasses.dataclass(frozen=True)
class FoundSteps:
    """The steps of one host and how they were found (`method` is said in the report)."""

    spans: tuple[StepSpan, ...]
    method: str
    # Keras' steps_per_execution: its step numbers advance by this much; None where the spans carry no
    # numbers (Keras' train-function calls, a loop's step function): counted from their iterator calls
    batches_per_step: int | None = 1



def find_steps(profile: Profile) -> FoundSteps:
    """Steps of the host plane; DataError naming the file and what was looked for when none."""
    return find_steps_in(profile.host, str(profile.path))


def find_steps_in(host: Plane, source: str) -> FoundSteps:
    events = list(host.events())
    markers = _sorted(e for e in events if "step_num" in e.stats and e.stats.get("_r") == 1)
    if markers:  # numbered by their first batch (StallMonitor under steps_per_execution): the stride says how many
        spans = _spans(markers)
        return FoundSteps(spans, f"step markers {_names(markers)}", batches_per_step=_stride(spans))
    numbered = _sorted(e for e in events if "step_num" in e.stats)
    if len(numbered) >= MIN_CALLS or (numbered and any(e.name == KERAS_BATCH for e in numbered)):
        how = "Keras' 'Profiled batch' spans" if _names(numbered) == repr(KERAS_BATCH) else f"spans {_names(numbered)}"
        spans = _spans(numbered)
        return FoundSteps(spans, how, batches_per_step=_stride(spans))
    python = [e for e in events if e.line == PYTHON_LINE]
    keras_calls = _top_level(e for e in python if e.name == KERAS_CALL)
    if keras_calls:
        return FoundSteps(_spans(keras_calls), f"Keras' {KERAS_CALL} calls", batches_per_step=None)
    calls = _top_level(e for e in python if "tf_function_call" in e.stats)
    counts = Counter(e.name for e in calls)
    if counts and counts.most_common(1)[0][1] >= MIN_CALLS:
        name = counts.most_common(1)[0][0]
        return FoundSteps(_loop_spans([e for e in calls if e.name == name]),
                          f"calls of the step function {name!r} (one loop iteration each)", batches_per_step=None)
    eager_next = _top_level(e for e in python if e.name == EAGER_GET_NEXT)
    if len(eager_next) > MIN_CALLS:
        spans = tuple(StepSpan("next(iterator)", index, a.start_ps, b.start_ps)
                      for index, (a, b) in enumerate(zip(eager_next, eager_next[1:])))
        return FoundSteps(spans, "eager next(iterator) calls (one loop iteration each, from one to the next)")
    raise DataError(
        f"{source}: no steps found in this profile (no step markers, no Keras 'Profiled batch' or "
        f"{KERAS_CALL} events, no tf.function called {MIN_CALLS}+ times and no eager next(iterator) "
        "on the Python thread); mark each "
        "step with tf.profiler.experimental.Trace('train', step_num=i, _r=1), or let stallscope mark and profile "
        "them: StallMonitor (a Keras fit's callback) or `with stallscope.profile(LOG_DIR)` and stallscope.step(i) "
        "(a custom loop)"
    )


def _sorted(events) -> list[Event]:
    return sorted(events, key=lambda e: e.start_ps)


def _names(events: Sequence[Event]) -> str:
    return ", ".join(repr(n) for n in sorted({e.name for e in events}))


def _spans(events: Sequence[Event]) -> tuple[StepSpan, ...]:
    return tuple(StepSpan(e.name, int(e.stats.get("step_num", index)), e.start_ps, e.end_ps)
                 for index, e in enumerate(events))


def _stride(spans: Sequence[StepSpan]) -> int:
    """The usual step-number increment (an epoch boundary restarts Keras' numbers; ignored)."""
    steps = Counter(b.number - a.number for a, b in zip(spans, spans[1:]) if b.number > a.number)
    return steps.most_common(1)[0][0] if steps else 1


def _top_level(events) -> list[Event]:
    """Events not nested in an earlier one of the same set (a function calling another)."""
    out: list[Event] = []
    for event in _sorted(events):
        if not out or event.start_ps >= out[-1].end_ps:
            out.append(event)
    return out


def _loop_spans(calls: Sequence[Event]) -> tuple[StepSpan, ...]:
    spans, previous_end = [], None
    for index, call in enumerate(calls):
        start = call.start_ps if previous_end is None else previous_end
        spans.append(StepSpan(call.name, index, start, call.end_ps))
        previous_end = call.end_ps
    return tuple(spans)
