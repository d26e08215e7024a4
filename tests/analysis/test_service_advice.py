"""diagnose's tf.data service advice: given where the input is CPU-bound (the wait is CPU work that
every free core, fully parallel, would still not keep up with), sized by the service model, and not
given where the wait is storage."""

from __future__ import annotations

import pytest

from stallscope.analysis.differential import PipelineBreakdown, attribute
from stallscope.analysis.service_advice import service_advice
from stallscope.analysis.service_sizing import decoded_image_bytes

from .conftest import loop_probe

BATCH = 32


def _phase(parts: PipelineBreakdown, *, step_ms: float, wait_ms: float, compute_ms: float = 10.0, cores: float = 2):
    return attribute(compute=loop_probe("compute", compute_ms, 0.0, compute_ms),
                     end_to_end=loop_probe("end_to_end", step_ms, wait_ms, compute_ms), parts=parts,
                     batch_size=BATCH, cores=cores, phase="head")


def _advice(parts, phase, *, own_workload=True, image_size=128):
    return service_advice(phase, parts, batch_size=BATCH, cores=2.0, own_workload=own_workload,
                          bytes_per_element=float(BATCH * decoded_image_bytes(image_size)))


def test_a_cpu_bound_input_gets_the_service_sized_with_its_code_and_commands():
    # 96 ms of CPU per batch on 2 parallel threads: 48 ms a batch against a 10 ms step
    parts = PipelineBreakdown(warm_ms=48.0, cold_ms=None, cpu_ms=48.0, waiting_ms=0.0, storage_ms=0.0, threads=2.0,
                              cpu_ms_per_image=96.0 / BATCH)
    phase = _phase(parts, step_ms=48.0, wait_ms=38.0)
    assert phase.cause == "preprocessing"
    item = _advice(parts, phase)
    assert item is not None and item.key == "data_service" and item.sizing is not None
    plan = item.sizing
    assert plan.ceiling.bound == "device" and plan.workers_needed == plan.ceiling.workers
    assert f"{plan.ceiling.workers} tf.data service worker(s)" in item.title
    assert "tf.data.experimental.service.distribute(" in item.code and "compression=None" in item.code
    assert "stallscope serve worker --dispatcher" in item.command and "train --data-service" in item.command
    assert "KiB per image" in item.reason and "the link must carry" in item.reason
    # said of a sequential map too, where a core may still be free: what holds is that all of them would not do
    assert "every core here is busy" not in item.reason
    assert "all of them working in parallel, would still leave the step waiting" in item.reason
    assert item.predicted_gain == pytest.approx(48.0 / 10.0 - 1.0)  # the device's pace, reached
    assert "train --data-service" not in _advice(parts, phase, own_workload=False).command
    # 224 px float32 batches at the device's 100 batches/s are 1.9 GB/s: a 10 Gbit/s link caps it first
    capped = _advice(parts, phase, image_size=224)
    assert capped.sizing.ceiling.bound == "link" and capped.sizing.workers_needed is None
    assert "(the link caps it)" in capped.title


def test_a_storage_bound_input_gets_no_service_advice():
    # 40 ms a batch of waiting on reads, 2 ms of CPU: more CPUs elsewhere would wait the same
    parts = PipelineBreakdown(warm_ms=42.0, cold_ms=None, cpu_ms=2.0, waiting_ms=40.0, storage_ms=0.0, threads=2.0,
                              cpu_ms_per_image=4.0 / BATCH)
    phase = _phase(parts, step_ms=42.0, wait_ms=32.0)
    assert phase.cause == "fetch"
    assert _advice(parts, phase) is None


def test_a_serial_cpu_stall_that_the_free_cores_would_absorb_gets_no_service_advice():
    # a sequential map of 30 ms CPU a batch on a host with 8 free cores: parallelism, not machines
    parts = PipelineBreakdown(warm_ms=30.0, cold_ms=None, cpu_ms=30.0, waiting_ms=0.0, storage_ms=0.0, threads=1.0,
                              cpu_ms_per_image=30.0 / BATCH)
    phase = _phase(parts, step_ms=40.0, wait_ms=30.0, cores=8)
    assert phase.cause == "preprocessing"
    assert _advice(parts, phase) is None


def test_a_service_gaining_its_last_few_percent_is_checked_not_advised():
    """benchmarks/advice_programs.py: a healthy generator `fit` on saturated cores, 6% input-bound, was
    advised a tf.data service. It takes other machines: under SERVICE_MIN_GAIN it is a note, in every
    report (diagnose, stallscope.diagnose, analyze)."""
    import dataclasses

    from stallscope.analysis import differential
    from stallscope.analysis.advice import split_by_gain
    from stallscope.analysis.fix_gain import SERVICE_MIN_GAIN
    from stallscope.report.text import checked_line

    parts = PipelineBreakdown(warm_ms=96.0, cold_ms=None, cpu_ms=96.0, waiting_ms=0.0, storage_ms=0.0,
                              threads=2.0, cpu_ms_per_image=6.0)
    item = _advice(parts, _phase(parts, step_ms=58.0, wait_ms=48.0))
    assert item.predicted_gain >= SERVICE_MIN_GAIN
    small = dataclasses.replace(item, predicted_gain=0.08)
    notes: list[str] = []
    assert differential.with_service([], item, notes) == [item] and notes == []
    assert differential.with_service([], small, notes) == []
    assert notes[0].startswith("checked, +8% predicted, under the 25% that pays for other machines: Move preproc")
    fixes, checked = split_by_gain([small])
    assert fixes == [] and checked == [small]
    assert "+8% predicted, under the 25% that pays for other machines" in checked_line(small)
