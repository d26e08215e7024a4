"""The tf.data service advice of a differential diagnosis (`diagnose`, `stallscope.diagnose`): where the
input is CPU-bound, the service model (`service_sizing`) fed with the probes' own figures.

CPU-bound means the wait is CPU work (cause "preprocessing") that every free core here, with every
stage parallel and prefetched (the more-cores what-if's first row, the figure the report prints),
would still not finish within a step: only more CPUs elsewhere, or less work, help.
"""

from __future__ import annotations

import dataclasses
import math

from stallscope.analysis import service_sizing as sizing
from stallscope.analysis import whatif
from stallscope.analysis.advice import Advice, data_service_advice


def cpu_bound(phase) -> bool:
    """The phase waits on CPU work that all the free cores, fully parallel, would still leave input-bound."""
    if phase.cause != "preprocessing" or not phase.cores:
        return False
    return phase.cores[0].prediction.verdict != "not"


def service_inputs(phase, parts, *, batch_size: int, cores: float, bytes_per_element: float | None,
                   batches_per_step: int = 1,
                   assumptions: sizing.ServiceAssumptions = sizing.ServiceAssumptions()) -> sizing.ServiceInputs:
    """The sizing's inputs from a diagnosis: the pipeline's CPU per batch measured alone (all threads),
    the compute alone as the device's pace, this host's free cores for receiving and, unless the
    assumptions say the workers' cores, for workers like it; the link as given, else the default."""
    return assumptions.apply(sizing.ServiceInputs(
        cpu_ms_per_element=max(parts.cpu_ms_per_image * batch_size, 1e-6),
        bytes_per_element=bytes_per_element,
        device_elements_per_second=batches_per_step * 1000.0 / max(phase.compute_ms, 1e-6),
        worker_cores=cores, trainer_cores=cores, images_per_element=batch_size,
        local_elements_per_second=batches_per_step * 1000.0 / phase.step_ms if phase.step_ms > 0 else None))


def service_advice(phase, parts, *, batch_size: int, cores: float, bytes_per_element: float | None,
                   own_workload: bool, batches_per_step: int = 1,
                   assumptions: sizing.ServiceAssumptions = sizing.ServiceAssumptions()) -> Advice | None:
    """The sized service advice, priced by the sizing's ceiling; None where the input is not CPU-bound.
    `assumptions`: the link and the workers' cores where the user said them."""
    if not cpu_bound(phase):
        return None
    inputs = service_inputs(phase, parts, batch_size=batch_size, cores=cores, bytes_per_element=bytes_per_element,
                            batches_per_step=batches_per_step, assumptions=assumptions)
    plan = sizing.size_service(inputs)
    evidence = (f"{phase.preprocessing_stall_ms:.1f} ms of each {phase.step_ms:.1f} ms step waits on CPU work; with "
                f"all {cores:.1f} free core(s) parallel the input share would still be "
                f"{phase.cores[0].prediction.input_share:.0%}")
    item = data_service_advice(plan, evidence, own_workload=own_workload,
                               basis="measured by the pipeline-alone probe")
    pipeline = batches_per_step * 1000.0 / plan.ceiling.elements_per_second
    predicted = whatif.predict(compute_ms=phase.compute_ms, pipeline_ms=pipeline, batch_size=1, overlapped=True)
    gain = phase.step_ms / predicted.step_ms - 1.0 if predicted.step_ms > 0 else math.inf
    return dataclasses.replace(item, predicted_step_ms=predicted.step_ms, predicted_gain=gain, gain_basis=(
        f"step {phase.step_ms:.1f} -> {predicted.step_ms:.1f} ms: {plan.ceiling.workers} worker(s) make "
        f"{plan.ceiling.images_per_second:,.0f} images/s ({plan.ceiling.bound}-bound) against compute "
        f"{phase.compute_ms:.1f} ms"))
