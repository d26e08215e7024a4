"""The emulated accelerator's spelling and waits; step statistics and the console line."""

import dataclasses
import time

import pytest

from stallscope.errors import UsageError
from stallscope.verdict import verdict_for
from stallscope.workload.accelerator import Accelerator, EmulatedDevice, parse_accelerator
from stallscope.workload.resources import minor_faults
from stallscope.workload.rundir import STEPS_NAME, StepRecord, read_steps, write_steps
from stallscope.workload.timing import StepClock, format_step_line, percentile, summarize_steps


@pytest.mark.parametrize("text, ips, ms", [
    ("emulated:2000", 2000.0, None), ("emulated:15ms", None, 15.0), ("EMULATED:2.5MS", None, 2.5),
    ("emulated:125.5", 125.5, None),
])
def test_parse_emulated(text, ips, ms):
    accelerator = parse_accelerator(text)
    assert accelerator.emulated
    assert (accelerator.images_per_second, accelerator.ms_per_step) == (ips, ms)
    assert parse_accelerator(accelerator.spec) == accelerator


def test_parse_real():
    assert parse_accelerator(" real ") == Accelerator()
    assert not Accelerator().emulated


@pytest.mark.parametrize("bad", ["emulated", "emulated:", "emulated:fast", "gpu", "emulated:-5", "emulated:0", "emulated:5s"])
def test_parse_rejects_with_flag_name(bad):
    with pytest.raises(UsageError, match="accelerator"):
        parse_accelerator(bad)


def test_step_seconds_scales_with_batch_or_is_fixed():
    assert parse_accelerator("emulated:2000").step_seconds(32) == pytest.approx(0.016)
    assert parse_accelerator("emulated:15ms").step_seconds(32) == pytest.approx(0.015)
    assert parse_accelerator("emulated:15ms").step_seconds(1) == pytest.approx(0.015)


def test_emulated_wait_lasts_the_step_and_uses_no_cpu():
    import numpy as np

    device = EmulatedDevice(parse_accelerator("emulated:100"))  # 8 images -> 80 ms
    batch = (np.zeros((8, 4, 4, 3), np.float32), np.zeros((8, 3), np.float32))
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    assert device.run_step(batch) == 8
    wall, cpu = time.perf_counter() - wall_before, time.process_time() - cpu_before
    assert 0.079 <= wall < 1.0  # generous: the machine is shared
    assert cpu < 0.5 * wall      # a wait, not a spin


def _record(step, step_ms, wait_ms, warmup=False, images=4):
    return StepRecord(step=step, phase="train", started_s=step * 0.1, step_ms=step_ms, input_wait_ms=wait_ms,
                      compute_ms=step_ms - wait_ms, images=images, warmup=warmup)


def test_summarize_excludes_warmup_and_classifies():
    steps = [_record(1, 5000.0, 4000.0, warmup=True)] + [_record(i, 100.0, 30.0) for i in range(2, 6)]
    stats = summarize_steps(steps)
    assert stats.steps == 5 and stats.warmup_steps == 1 and stats.images == 16
    assert stats.step_time_ms == pytest.approx(100.0)
    assert stats.input_wait_ms == pytest.approx(30.0)
    assert stats.compute_ms == pytest.approx(70.0)
    assert stats.input_share == pytest.approx(0.3)
    assert stats.verdict == "highly" == verdict_for(0.3)
    assert stats.images_per_second == pytest.approx(40.0)
    assert stats.step_time_std_ms == pytest.approx(0.0)


def test_summarize_all_warmup_falls_back_to_every_step():
    stats = summarize_steps([_record(1, 10.0, 0.1, warmup=True)])
    assert stats.step_time_ms == pytest.approx(10.0) and stats.verdict == "not"


def test_percentile_interpolates_like_numpy():
    import numpy as np

    values = [3.0, 1.0, 10.0, 7.0, 2.0]
    for q in (0, 50, 90, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_step_line_matches_seed_format():
    window = [_record(39, 600.0, 10.0, images=24), _record(40, 612.0, 14.2, images=24)]
    line = format_step_line(40, window, 0.7634)
    assert line == "step 40, loss = 0.76 (39.6 examples/sec; 0.606 sec/batch; input wait 12.1 ms)"
    assert format_step_line(40, window, None).startswith("step 40 (39.6 examples/sec")


def test_the_step_clock_counts_the_page_faults_of_the_step():
    """Touching 4 MB of fresh anonymous memory in a step takes ~1,000 minor faults (4 KB pages); the
    step's record says so, and the summary divides the measured steps' faults by their images."""
    import mmap

    if minor_faults() is None:
        pytest.skip("this OS keeps no count of page faults")
    clock = StepClock()
    clock.start()
    fresh = mmap.mmap(-1, 4 << 20)
    for offset in range(0, len(fresh), mmap.PAGESIZE):
        fresh[offset] = 1
    fresh.close()
    clock.batch_received()
    clock.step_done()
    record = clock.record(step=1, phase="train", images=8, warmup=False)
    assert record.minor_faults >= 0.9 * (4 << 20) // mmap.PAGESIZE
    quiet = dataclasses.replace(record, step=2, minor_faults=0)
    assert summarize_steps([record, quiet]).minor_faults_per_image == pytest.approx(record.minor_faults / 16)
    assert summarize_steps([record, dataclasses.replace(quiet, minor_faults=None)]).minor_faults_per_image is None


def test_steps_written_before_fault_counts_read_back_without_them(tmp_path):
    """A run directory from before the column still reads: its steps have no count."""
    write_steps(tmp_path, [_record(1, 10.0, 1.0), dataclasses.replace(_record(2, 10.0, 1.0), minor_faults=12)])
    assert [s.minor_faults for s in read_steps(tmp_path)] == [None, 12]
    lines = (tmp_path / STEPS_NAME).read_text().splitlines()
    header = lines[0].split(",")
    column = header.index("minor_faults")
    (tmp_path / STEPS_NAME).write_text("\n".join(
        ",".join(v for i, v in enumerate(line.split(",")) if i != column) for line in lines) + "\n")
    assert [s.minor_faults for s in read_steps(tmp_path)] == [None, None]
