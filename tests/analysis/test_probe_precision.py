"""diagnose's loop probes say how precise they are: the images/s of their measured steps' two halves,
and 'too short to trust' in the report where those disagree."""

from stallscope.analysis.probes import LoopProbe
from stallscope.report.diagnosis import _halves
from stallscope.workload.rundir import StepRecord


def _steps(step_ms):
    return [StepRecord(step=i + 1, phase="head", started_s=0.0, step_ms=ms, input_wait_ms=ms / 2, compute_ms=ms / 2,
                       images=8, warmup=i < 2) for i, ms in enumerate(step_ms)]


def test_a_probe_whose_halves_disagree_says_it_is_too_short():
    probe = LoopProbe.from_steps("end_to_end", "head", _steps([20.0] * 2 + [40.0] * 6 + [10.0] * 12))
    assert probe.halves_spread > 0.5 and probe.too_short
    assert _halves(probe).startswith("; its halves ") and _halves(probe).endswith("apart; too short to trust")


def test_a_steady_probe_states_its_precision():
    probe = LoopProbe.from_steps("end_to_end", "head", _steps([20.0] * 22))
    assert probe.halves_spread == 0.0 and not probe.too_short
    assert _halves(probe) == "; its halves 0% apart"
    few = LoopProbe.from_steps("end_to_end", "head", _steps([20.0] * 6))
    assert few.halves_spread is None and _halves(few) == ""
