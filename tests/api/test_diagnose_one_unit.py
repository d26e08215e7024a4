"""A diagnosis under steps_per_execution speaks one unit: per batch, the step's batches said once;
compute is never above the step it is part of."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import stallscope
from stallscope.analysis.differential import PipelineBreakdown, attribute
from stallscope.analysis.probes import LoopProbe

PARTS = PipelineBreakdown(warm_ms=10.0, cold_ms=None, cpu_ms=10.0, waiting_ms=0.0, storage_ms=0.0, threads=1.0,
                          cpu_ms_per_image=10.0 / 8)


def _loop(kind: str, step_ms: float, wait_ms: float) -> LoopProbe:
    share = wait_ms / step_ms
    return LoopProbe(kind=kind, phase="train", steps=10, step_ms=step_ms, input_wait_ms=wait_ms,
                     compute_ms=step_ms - wait_ms, images_per_second=32 * 1000.0 / step_ms, input_share=share,
                     verdict="not" if share < 0.05 else "moderately")


def test_compute_is_never_above_the_step_and_the_cached_figure_is_per_batch():
    """The issue's report: step 112.9 ms beside compute 125.3 ms, and 'data cached in memory: 451.7 ms
    step' per call of 4 batches where every other figure was per batch."""
    phase = attribute(compute=_loop("compute", 501.2, 0.0), end_to_end=_loop("end_to_end", 451.6, 28.0),
                      parts=PARTS, batch_size=8, cores=2.0, phase="train", batches_per_step=4)
    assert phase.step_ms == pytest.approx(112.9)
    assert phase.compute_ms <= phase.step_ms - phase.input_wait_ms + 1e-9
    assert phase.cached.step_ms == pytest.approx(phase.step_ms)
    assert phase.cached.input_wait_ms == pytest.approx(phase.input_wait_ms)


def test_a_faster_compute_probe_is_kept_as_measured():
    phase = attribute(compute=_loop("compute", 40.0, 0.0), end_to_end=_loop("end_to_end", 100.0, 10.0),
                      parts=PARTS, batch_size=8, cores=2.0, phase="train", batches_per_step=4)
    assert phase.compute_ms == pytest.approx(10.0) and phase.step_ms == pytest.approx(25.0)


def test_the_profiled_steps_of_a_report_are_per_batch_as_the_rest():
    images = np.random.default_rng(0).random((64, 16, 16, 3), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((images, np.arange(64) % 4)).repeat().batch(8).prefetch(2)
    model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(4)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    diagnosis = stallscope.diagnose(dataset, model=model, steps=6)
    (phase,) = diagnosis.phases
    assert phase.compute_ms <= phase.step_ms and phase.cached.step_ms == pytest.approx(phase.step_ms)
    text = diagnosis.text()
    assert "profile of end-to-end steps, per batch as above (each profiled step ran 4 batches):" in text
    per_call = diagnosis.analysis.steps.step_ms.mean
    row = next(line for line in text.splitlines() if line.startswith("step ") and "ms" in line)
    assert float(row.split()[1]) == pytest.approx(per_call / 4, abs=0.01)
    assert "stallscope analyze (not kept" not in text and "give work_dir= to keep it" in text
