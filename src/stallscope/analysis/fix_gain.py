"""Each fix's predicted gain, from the what-if model (`whatif.predict`) on the profile's own figures.

A step takes the compute time and the pipeline's time per step: overlapped (an asynchronous stage at
the end) the longer of the two, else their sum. From the profile: compute = step - input wait; the
pipeline's time is the wait (serial) or the whole step (overlapped, where the step waits for input).
A fix changes the pipeline's time (a stage's work spread over more calls, removed by a cache, shrunk
with the pixels) or the overlap (a prefetch); its gain is the step time now over the predicted one.
A fix predicted to gain under MIN_GAIN is no fix: reports list it as checked, no gain expected.
"""

from __future__ import annotations

import dataclasses
import math

from stallscope.analysis import whatif
from stallscope.analysis.steps import StepBreakdown
from stallscope.analysis.tfdata import Stage, StageTree

MIN_GAIN = 0.05              # a fix predicted to gain less is listed as checked, not as a fix
# The tf.data service takes other machines: it is advised from this predicted gain (a 6%-input-bound `fit`
# on saturated cores was advised a service for its last few percent), else checked.
SERVICE_MIN_GAIN = 0.25


def least_gain(key: str) -> float:
    """The predicted gain from which a change of this key is a fix."""
    return SERVICE_MIN_GAIN if key == "data_service" else MIN_GAIN


def below_least_gain_text(item) -> str:
    """Why a change predicted to gain something is still only checked."""
    if item.key == "data_service" and item.predicted_gain is not None and item.predicted_gain >= MIN_GAIN:
        return (f"{item.predicted_gain:+.0%} predicted, under the {SERVICE_MIN_GAIN:.0%} that pays for other "
                "machines")
    return "no gain expected"


@dataclasses.dataclass(frozen=True)
class Baseline:
    """The analysed steps in the what-if model's terms (ms per step)."""

    step_ms: float
    compute_ms: float
    pipeline_ms: float
    overlapped: bool
    per_step: float               # a stage's totals over the profile times this: per step
    idle_cores: float | None      # cores left idle over the steps; None: not measured
    cores_assumed: bool = False   # idle_cores is an assumption (no CPU samples), said beside the gain

    def predict(self, pipeline_ms: float | None = None, *, overlapped: bool | None = None) -> whatif.Prediction:
        pipeline = self.pipeline_ms if pipeline_ms is None else pipeline_ms
        return whatif.predict(compute_ms=self.compute_ms, pipeline_ms=max(0.0, pipeline), batch_size=1,
                              overlapped=self.overlapped if overlapped is None else overlapped)

    def gain(self, prediction: whatif.Prediction) -> float:
        """Step time now over the predicted one, less 1: 0.25 = 25% more steps per second."""
        return self.step_ms / prediction.step_ms - 1.0 if prediction.step_ms > 0 else math.inf


def baseline(steps: StepBreakdown, tree: StageTree, *, idle_cores: float | None,
             cores_assumed: bool = False) -> Baseline | None:
    """None where the input share was not measured (nothing to predict from) or no stage ran."""
    outer = tree.outermost
    if steps.input_share is None or outer is None or outer.calls == 0 or steps.step_ms.mean <= 0:
        return None
    step, wait = steps.step_ms.mean, steps.input_ms.mean
    overlapped = outer.asynchronous
    return Baseline(step_ms=step, compute_ms=max(step - wait, 0.0), pipeline_ms=step if overlapped else wait,
                    overlapped=overlapped, per_step=steps.batches_per_step / outer.calls,
                    idle_cores=idle_cores, cores_assumed=cores_assumed)


def stage_ms(base: Baseline, stage: Stage) -> tuple[float, float]:
    """(wall-clock busy, work summed over its calls) of a stage, per step."""
    return stage.busy_ms * base.per_step, stage.own_ms * base.per_step


def with_parallel_stage(base: Baseline, stage: Stage) -> tuple[whatif.Prediction, str]:
    """The stage's work spread over the calls the idle cores allow beside those it runs now."""
    busy, work = stage_ms(base, stage)
    idle = base.idle_cores if base.idle_cores is not None else 0.0
    calls = max(stage.concurrency, 1.0) + idle
    pipeline = max(0.0, base.pipeline_ms - busy + work / calls)
    cores = (f"{idle:.1f} idle core(s) over the steps" + (" assumed: no CPU samples" if base.cores_assumed else "")
             if idle > 0 else "no idle core over the steps: the CPU is saturated")
    basis = (f"{stage.name}'s {busy:.1f} ms per step over {calls:.1f} calls at once ({cores}) -> pipeline "
             f"{pipeline:.1f} ms per step")
    return base.predict(pipeline), basis


def with_prefetch(base: Baseline) -> tuple[whatif.Prediction, str]:
    """The pipeline beside the step instead of before it: on idle cores only (a saturated CPU takes turns)."""
    if base.overlapped:
        return base.predict(), "the pipeline's last stage already works ahead of the step: nothing left to overlap"
    if base.idle_cores == 0:
        return base.predict(), ("no idle core over the steps: the pipeline and the step would take turns on the "
                                "same busy cores, not overlap")
    return base.predict(overlapped=True), (f"pipeline {base.pipeline_ms:.1f} ms overlapped with compute "
                                           f"{base.compute_ms:.1f} ms instead of after it")


def without_stages(base: Baseline, stages: list[Stage], what: str) -> tuple[whatif.Prediction, str]:
    """The pipeline without these stages' work (a cache serving them from memory)."""
    busy = sum(stage_ms(base, s)[0] for s in stages)
    pipeline = max(0.0, base.pipeline_ms - busy)
    return base.predict(pipeline), f"{what}: {busy:.1f} ms per step less -> pipeline {pipeline:.1f} ms per step"


def with_smaller_images(base: Baseline, stage: Stage, stored_side: int,
                        image_size: int) -> tuple[whatif.Prediction, str]:
    """Decode cost grows with the pixels: the stage's work scaled by (input / stored side)^2."""
    busy, _ = stage_ms(base, stage)
    scale = min(1.0, (image_size / stored_side) ** 2)
    pipeline = max(0.0, base.pipeline_ms - busy * (1.0 - scale))
    return base.predict(pipeline), (f"{stage.name}'s {busy:.1f} ms per step scaled by the pixels, "
                                    f"({image_size}/{stored_side})^2 = {scale:.2f} -> pipeline {pipeline:.1f} ms")


def below(tree: StageTree, stage: Stage) -> list[Stage]:
    """The stage and every stage feeding it."""
    return [s for s in tree.stages if s.long_name == stage.long_name or s.long_name.startswith(stage.long_name + "::")]
