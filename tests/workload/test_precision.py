"""Measurements that run to a precision: the halves' agreement, the warning on a run too short to trust,
and a run that stops once its figure is that precise."""

import pytest

from stallscope.errors import UsageError
from stallscope.workload.precision import PrecisionTarget, halves, measure_precision, parse_precision, target_met
from stallscope.workload.rundir import StepRecord
from stallscope.workload.train import TrainOptions, run_training


def _steps(step_ms: list[float], images: int = 32, warmup: int = 2) -> list[StepRecord]:
    return [StepRecord(step=i + 1, phase="train", started_s=0.0, step_ms=ms, input_wait_ms=0.0, compute_ms=ms,
                       images=images, warmup=i < warmup) for i, ms in enumerate(step_ms)]


def test_a_short_run_whose_halves_disagree_is_flagged():
    """The run the issue saw: ~1.3 s, 368 images, half of it at ~290 images/s and half at ~650."""
    steps = _steps([50.0] * 2 + [110.0] * 6 + [49.0] * 6, images=32)
    precision = measure_precision(steps, target=None, stopped_by="steps")
    first, second = precision.halves_images_per_second
    assert first == pytest.approx(32 / 0.110, rel=0.01) and second > 450  # halves of the time, not of the steps
    assert precision.spread > 0.4 and not precision.reached
    assert precision.warning.startswith("too short to trust: ")
    assert "differ by" in precision.warning and "under 5 s" in precision.warning and "--precision 5%" in precision.warning


def test_a_long_steady_run_is_trusted():
    precision = measure_precision(_steps([100.0] * 62), target=None, stopped_by="steps")
    assert precision.spread == pytest.approx(0.0) and precision.reached and precision.warning is None
    assert precision.measured_s == pytest.approx(6.0)


def test_too_few_steps_to_halve_says_so():
    precision = measure_precision(_steps([10.0] * 6), target=None, stopped_by="steps")
    assert precision.halves_images_per_second is None and precision.spread is None
    assert "too few to compare two halves" in precision.warning


def test_one_step_that_holds_most_of_the_time_is_named_as_the_reason():
    """The seeds' pipeline on a store at 30 ms: a shuffle of the whole pass refills in one 30 s step,
    then 39 steps come from its buffer in 8 ms each; steps enough, but no two halves to compare."""
    precision = measure_precision(_steps([10.0] * 2 + [8.0] * 36 + [30_000.0]), target=None, stopped_by="steps")
    assert precision.halves_images_per_second is None
    assert "1 long step(s) of its 37 measured hold 99% of the measured time (30.0 s: a buffer filling" in precision.warning
    assert "too few" not in precision.warning


def _passes(refills: int, refill_ms: float = 7000.0) -> list[StepRecord]:
    """A pass of 40 batches whose first waits for the shuffle to take in the pass again, the rest from
    its buffer: the run starts mid-pass, after its warm-up, and ends mid-pass."""
    one = [refill_ms] + [8.0] * 39
    return _steps([10.0] * 2 + [8.0] * 20 + one * refills + [8.0] * 10)


def test_a_run_of_refilling_passes_is_halved_in_whole_passes():
    """Three refills: a cut in the middle of the time puts two on one side and the halves disagree by
    about 70% however long the run; halves of whole passes agree."""
    steps = _passes(3)
    first, second = halves(steps)
    assert first == pytest.approx(second) == pytest.approx(40 * 32 / ((7000.0 + 39 * 8.0) / 1000))
    precision = measure_precision(steps, target=PrecisionTarget(0.05, 1.0, 30.0), stopped_by="precision")
    assert precision.reached and precision.spread == pytest.approx(0.0)
    slower_later = _steps([10.0] * 2 + [8.0] * 20 + ([7000.0] + [8.0] * 39) * 2 + ([9000.0] + [8.0] * 39) * 2)
    first, second = halves(slower_later)
    assert second < first * 0.85, "a drift between passes still shows"
    assert halves(_passes(2)) is None  # one whole pass between two refills: nothing to compare it with


def test_an_occasional_slow_step_leaves_the_usual_halves():
    steps = _steps([10.0] * 2 + [100.0] * 30 + [900.0] + [100.0] * 30)
    first, second = halves(steps)
    assert first == pytest.approx(32 / 0.1, rel=0.01) and second < first


def test_the_target_waits_for_its_minimum_time_then_agreement():
    target = PrecisionTarget(0.05, min_seconds=1.0, max_seconds=3.0)
    assert target_met(_steps([100.0] * 10), target) is None  # 0.8 s measured: not yet
    assert target_met(_steps([100.0] * 14), target) == "precision"
    drifting = _steps([100.0] * 2 + [50.0 + 5 * i for i in range(40)])
    assert halves(drifting)[0] > halves(drifting)[1] * 1.05
    assert target_met(drifting, target) == "max_seconds"  # never agrees: stops at the maximum


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), (" 12.5% ", 0.125)])
def test_precision_spellings(text, value):
    assert parse_precision(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["0", "100%", "five", "-5%"])
def test_bad_precision_is_one_line(text):
    with pytest.raises(UsageError, match=r"^--precision: expected a share"):
        parse_precision(text)


def test_precision_and_steps_are_refused_together(tiny_tree, make_pipeline):
    with pytest.raises(UsageError, match="^--precision: .*give one of them"):
        TrainOptions(source="files", dataset_path=tiny_tree, pipeline=make_pipeline("seed"), steps=10,
                     accelerator="emulated:5ms", precision=PrecisionTarget(0.05))


def test_a_run_to_a_precision_repeats_the_data_until_its_halves_agree(tiny_tree, make_pipeline, tmp_path):
    """An emulated 10 ms device fed from cached batches: steady, so a loose target is met soon after the
    minimum time, past the 6 batches of one epoch of the tiny tree."""
    target = PrecisionTarget(0.25, min_seconds=0.3, max_seconds=20.0)
    result = run_training(TrainOptions(
        source="files", dataset_path=tiny_tree, pipeline=make_pipeline("tuned", cache="memory"),
        accelerator="emulated:10ms", precision=target, log_path=tmp_path / "run"))
    precision = result.summary["precision"]
    assert precision["stopped_by"] == "precision" and precision["reached"] and precision["target"] == 0.25
    assert precision["spread"] <= 0.25 and precision["measured_s"] >= 0.3
    assert result.summary["steps"] > 6  # more than one pass over the 24 images
    assert result.summary["epochs"] is None and result.summary["total_steps"] is None
