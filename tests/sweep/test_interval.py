"""The 95% t-interval over a cell's repeats, against scipy's Student t where scipy is installed."""

from __future__ import annotations

import math
import statistics

import pytest

from stallscope.sweep.interval import t_interval, t_quantile_975


def test_three_repeats_by_hand():
    interval = t_interval([1.0, 2.0, 3.0])
    half = 4.3027 * 1.0 / math.sqrt(3)
    assert (interval.mean, interval.low, interval.high, interval.n) == pytest.approx((2.0, 2.0 - half, 2.0 + half, 3))


def test_one_repeat_has_no_interval():
    assert t_interval([412.0]) is None and t_interval([]) is None


def test_a_share_is_clipped_to_what_it_can_be():
    interval = t_interval([0.01, 0.05], floor=0.0, ceiling=1.0)
    assert interval.low == 0.0 and interval.high < 1.0 and interval.mean == pytest.approx(0.03)


@pytest.mark.parametrize("df", [1, 2, 4, 9, 29, 30, 31, 45, 120])
def test_quantiles_match_students_t(df):
    stats = pytest.importorskip("scipy.stats")
    assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-4 if df <= 30 else 1e-3)


def test_interval_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    values = [291.0, 651.0, 359.0, 747.0, 512.0]
    low, high = stats.t.interval(0.95, len(values) - 1, loc=statistics.fmean(values), scale=stats.sem(values))
    interval = t_interval(values)
    assert (interval.low, interval.high) == pytest.approx((low, high), rel=1e-4)


def test_the_difference_of_two_sweeps_means_has_a_welch_interval():
    from stallscope.sweep.interval import difference_interval

    # variances 1 and 1 over 3 runs each: 4 degrees of freedom, t = 2.7764, half = t * sqrt(2/3)
    d = difference_interval([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    assert d.mean == pytest.approx(1.0) and d.low == pytest.approx(1.0 - 2.2669, abs=1e-3)
    assert d.high == pytest.approx(1.0 + 2.2669, abs=1e-3) and d.n == 6
    assert difference_interval([5.0], [5.0, 6.0]) is None
    same = difference_interval([7.0, 7.0], [8.0, 8.0])
    assert same.low == same.high == pytest.approx(1.0)


def test_an_input_share_of_two_repeats_is_not_0_to_100_percent_once_pooled():
    """Two repeats at 93% and 97% input-bound: a plain t-interval (1 degree of freedom) spans 70-100%,
    the logit's alone stays inside 0-100% by itself, and pooled with a sweep whose cells agree to about
    0.1 on the logit scale it is a few points wide."""
    from stallscope.sweep.interval import logit_interval
    from stallscope.sweep.pooled_variance import VariancePrior, logit

    shares = [0.93, 0.97]
    assert t_interval(shares, floor=0.0, ceiling=1.0).low < 0.75
    own = logit_interval(shares)
    assert 0.0 < own.low < 0.93 and 0.97 < own.high < 1.0
    centre = statistics.fmean(logit(s) for s in shares)
    assert own.mean == pytest.approx(1 / (1 + math.exp(-centre)))
    pooled = logit_interval(shares, prior=VariancePrior(variance=0.01, df=20.0, cells=12))
    assert own.low < pooled.low < pooled.mean < pooled.high < own.high
    assert pooled.high - pooled.low < 0.05
    assert logit_interval([0.5]) is None


def test_a_share_of_exactly_0_or_1_has_an_interval_inside_the_range():
    from stallscope.sweep.interval import logit_interval

    for shares in ([0.0, 0.0, 0.01], [1.0, 1.0, 0.99]):
        interval = logit_interval(shares)
        assert 0.0 < interval.low <= min(shares) + 0.001 and max(shares) - 0.001 <= interval.high < 1.0, interval
