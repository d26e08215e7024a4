"""What-if arithmetic: the overlap model, the knee, more cores. No TensorFlow."""

from __future__ import annotations

import math

import pytest

from stallscope.analysis import whatif
from stallscope.errors import UsageError


def test_overlapped_step_is_the_slower_of_compute_and_pipeline():
    fast_device = whatif.predict(compute_ms=10.0, pipeline_ms=40.0, batch_size=32, overlapped=True)
    assert fast_device.step_ms == 40.0
    assert fast_device.input_wait_ms == 30.0
    assert fast_device.input_share == pytest.approx(0.75)
    assert fast_device.verdict == "highly"
    assert fast_device.images_per_second == pytest.approx(800.0)

    slow_device = whatif.predict(compute_ms=50.0, pipeline_ms=40.0, batch_size=32, overlapped=True)
    assert slow_device.input_wait_ms == 0.0
    assert slow_device.verdict == "not"


def test_the_part_no_prefetch_hides_adds_to_the_overlapped_step():
    """A shuffle that takes in a whole epoch from storage reads before the epoch's first batch: that
    part of the pipeline's time adds to the step, the rest overlaps the device's."""
    fast = whatif.predict(compute_ms=8.0, pipeline_ms=20.0, batch_size=32, overlapped=True, unhidden_ms=5.0)
    assert fast.step_ms == pytest.approx(20.0) and fast.unhidden_ms == 5.0
    slow = whatif.predict(compute_ms=20.0, pipeline_ms=20.0, batch_size=32, overlapped=True, unhidden_ms=5.0)
    assert slow.step_ms == pytest.approx(25.0) and slow.input_wait_ms == pytest.approx(5.0)
    assert whatif.predict(compute_ms=20.0, pipeline_ms=20.0, batch_size=32, overlapped=False,
                          unhidden_ms=5.0).step_ms == pytest.approx(40.0)
    all_of_it = whatif.predict(compute_ms=1.0, pipeline_ms=4.0, batch_size=32, overlapped=True, unhidden_ms=9.0)
    assert all_of_it.unhidden_ms == 4.0 and all_of_it.step_ms == pytest.approx(5.0)  # at most the pipeline's time
    with pytest.raises(UsageError, match="unhidden_ms"):
        whatif.predict(compute_ms=1.0, pipeline_ms=4.0, batch_size=32, overlapped=True, unhidden_ms=-1.0)


def test_serial_step_adds_pipeline_to_compute():
    result = whatif.predict(compute_ms=90.0, pipeline_ms=10.0, batch_size=10, overlapped=False)
    assert result.step_ms == 100.0
    assert result.input_share == pytest.approx(0.10)
    assert result.verdict == "moderately"
    assert result.images_per_second == pytest.approx(100.0)


def test_knee_is_the_pipeline_throughput_and_sweep_turns_input_bound_above_it():
    # 32 images in 16 ms: the pipeline delivers 2000 images/s.
    assert whatif.knee_images_per_second(pipeline_ms=16.0, batch_size=32) == pytest.approx(2000.0)
    rows = whatif.accelerator_sweep(pipeline_ms=16.0, batch_size=32, overlapped=True,
                                    device_speeds=(1000.0, 2000.0, 4000.0))
    shares = [row.prediction.input_share for row in rows]
    assert shares[0] == 0.0 and shares[1] == pytest.approx(0.0)
    assert shares[2] == pytest.approx(0.5)
    # throughput saturates at the knee whatever the device speed
    assert rows[2].prediction.images_per_second == pytest.approx(2000.0)


def test_the_device_sweep_reaches_past_the_knee_of_a_fast_pipeline():
    assert whatif.device_speeds_past(1000.0) == whatif.DEFAULT_DEVICE_SPEEDS
    faster = whatif.device_speeds_past(13_673.0)
    assert faster[:len(whatif.DEFAULT_DEVICE_SPEEDS)] == whatif.DEFAULT_DEVICE_SPEEDS
    assert faster[-2] < 2 * 13_673.0 <= faster[-1] == 32_000.0


@pytest.mark.parametrize("overlapped", [True, False])
def test_highly_bound_above_is_where_the_share_crosses_twenty_percent(overlapped):
    speed = whatif.highly_bound_above(pipeline_ms=16.0, batch_size=32, overlapped=overlapped)
    at = whatif.predict(compute_ms=whatif.device_step_ms(speed, 32), pipeline_ms=16.0, batch_size=32,
                        overlapped=overlapped)
    assert at.input_share == pytest.approx(0.20)
    below = whatif.predict(compute_ms=whatif.device_step_ms(speed * 0.9, 32), pipeline_ms=16.0, batch_size=32,
                           overlapped=overlapped)
    assert below.input_share < 0.20


def test_more_cores_scale_until_the_storage_floor():
    rows = whatif.cores_sweep(cpu_ms_per_image=2.0, cores=2, batch_size=10, compute_ms=1.0,
                              floor_ms_per_image=0.25, extra_cores=(0, 2, 6, 14))
    throughput = [row.pipeline_images_per_second for row in rows]
    assert throughput[0] == pytest.approx(1000.0)   # 2 cores / 2 ms per image
    assert throughput[1] == pytest.approx(2000.0)   # 4 cores
    assert throughput[2] == pytest.approx(4000.0)   # 8 cores: the 0.25 ms floor
    assert throughput[3] == pytest.approx(4000.0)   # 16 cores cannot beat storage
    assert [row.cores for row in rows] == [2, 4, 8, 16]
    assert rows[0].prediction.input_share > rows[2].prediction.input_share


def test_bad_figures_are_rejected_by_name():
    with pytest.raises(UsageError, match="pipeline_ms"):
        whatif.predict(compute_ms=1.0, pipeline_ms=-1.0, batch_size=1, overlapped=True)
    with pytest.raises(UsageError, match="images_per_second"):
        whatif.device_step_ms(0.0, 32)
    with pytest.raises(UsageError, match="cores"):
        whatif.pipeline_ms_with_cores(cpu_ms_per_image=1.0, cores=math.nan, batch_size=1)
