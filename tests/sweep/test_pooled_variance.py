"""Pooling a cell's run-to-run variance with the sweep's (empirical Bayes), and the intervals built on it."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from stallscope.sweep.interval import log_interval, t_quantile_975
from stallscope.sweep.pooled_variance import (VariancePrior, digamma, fit_prior, pooled, trigamma,
                                              trigamma_inverse)


@pytest.mark.parametrize("x", [0.3, 1.0, 2.5, 7.0, 40.0])
def test_the_special_functions_match_scipy(x):
    special = pytest.importorskip("scipy.special")
    assert digamma(x) == pytest.approx(special.digamma(x), abs=1e-9)
    assert trigamma(x) == pytest.approx(special.polygamma(1, x), abs=1e-9)
    assert trigamma(trigamma_inverse(trigamma(x))) == pytest.approx(trigamma(x), rel=1e-8)


def test_the_prior_of_many_cells_recovers_how_their_variances_were_drawn():
    """Variances drawn as s0^2 d0 / chi2(d0), each seen through 3 runs (2 df): the fit finds d0 and s0."""
    rng = random.Random(7)
    cells = []
    for _ in range(20000):
        true_variance = 0.02 ** 2 * 8.0 / rng.gammavariate(4.0, 2.0)  # d0 = 8 around 2%
        runs = [rng.gauss(0.0, math.sqrt(true_variance)) for _ in range(3)]
        cells.append((statistics.variance(runs), 2))
    prior = fit_prior(cells)
    assert prior.df == pytest.approx(8.0, rel=0.25) and prior.typical_spread == pytest.approx(0.02, rel=0.05)
    assert prior.cells == 20000


def test_cells_whose_spreads_are_alike_pool_completely_and_few_cells_do_not_pool():
    alike = [(0.0001 * f, 2) for f in (0.9, 1.0, 1.1, 0.95, 1.05)]  # closer than 2-df estimates ever are
    prior = fit_prior(alike)
    # a 2-df variance's log falls short of the true one's by digamma(1) on average: the prior corrects it
    assert math.isinf(prior.df) and prior.typical_spread == pytest.approx(0.01 * math.exp(-digamma(1.0) / 2), rel=0.01)
    assert pooled(0.04, 2, prior) == (prior.variance, math.inf)
    assert fit_prior([(0.01, 2), (0.02, 2)]) is None and fit_prior([(0.01, 0)] * 5) is None
    assert pooled(0.04, 2, None) == (0.04, 2.0)


def test_a_pooled_variance_weighs_the_cell_against_the_sweep():
    prior = VariancePrior(variance=0.0001, df=2.0, cells=40)
    variance, df = pooled(0.0009, 2, prior)
    assert variance == pytest.approx(0.0005) and df == 4.0


def test_three_runs_that_agree_by_chance_get_the_sweeps_spread():
    """726.9, 727.8, 728.2 images/s: alone a 0.2% interval; pooled with a sweep whose runs typically
    differ by 1.2%, its mean's interval is 1.4% either side and a re-run's 2.0%."""
    runs = [726.9, 727.8, 728.2]
    alone = log_interval(runs)
    prior = VariancePrior(variance=0.012 ** 2, df=2.4, cells=40)
    pooled_interval = log_interval(runs, prior=prior)
    assert alone.high / alone.low < 1.005
    assert 1.012 < pooled_interval.high / pooled_interval.mean < 1.016
    rerun = log_interval(runs, prior=prior, rerun_repeats=3)
    assert 1.018 < rerun.high / rerun.mean < 1.022


def test_the_rerun_interval_is_the_prediction_interval_of_a_rerun_mean():
    values = [100.0, 110.0, 121.0]  # logs step by log(1.1): sd of logs = log(1.1)
    mean = math.exp(statistics.fmean(math.log(v) for v in values))
    ci = log_interval(values)
    rerun = log_interval(values, rerun_repeats=3)
    half = t_quantile_975(2) * math.log(1.1)
    assert ci.mean == pytest.approx(mean) == pytest.approx(110.0)
    assert math.log(ci.high / mean) == pytest.approx(half / math.sqrt(3))
    assert math.log(rerun.high / mean) == pytest.approx(half * math.sqrt(2 / 3))
    assert math.log(mean / rerun.low) == pytest.approx(half * math.sqrt(2 / 3))
    assert log_interval([5.0]) is None and log_interval([0.0, 5.0]) is None


def test_a_rerun_mean_falls_in_the_rerun_interval_about_95_percent_of_the_time():
    """Simulated sweeps of 3 repeats, re-run: the prediction interval holds the re-run's geometric mean
    about 95% of the time; the interval of the first mean alone, less often (about 91% with 3 repeats,
    83% with many)."""
    rng = random.Random(11)
    held = held_by_ci = 0
    trials = 4000
    for _ in range(trials):
        first = [math.exp(rng.gauss(6.0, 0.03)) for _ in range(3)]
        again = math.exp(statistics.fmean(rng.gauss(6.0, 0.03) for _ in range(3)))
        rerun, ci = log_interval(first, rerun_repeats=3), log_interval(first)
        held += rerun.low <= again <= rerun.high
        held_by_ci += ci.low <= again <= ci.high
    assert 0.93 < held / trials < 0.97
    assert held_by_ci / trials < 0.93


@pytest.mark.parametrize("df", [2.4, 7.9, 30.5])
def test_a_fractional_df_reads_the_table_at_the_whole_number_below(df):
    assert t_quantile_975(df) == t_quantile_975(math.floor(df))
    assert t_quantile_975(math.inf) == pytest.approx(1.959964)


def test_a_sweep_pools_its_cells_spreads_and_says_so():
    import dataclasses

    from stallscope.sweep.figures import Cell, CellResult, RunFigures
    from stallscope.sweep.results import variance_prior
    from stallscope.sweep.table import pooling_note

    def figures(rates):
        return [RunFigures(repeat=i + 1, run_dir=f"cells/x/repeat-{i + 1}", images_per_second=r, step_time_ms=8.0,
                           input_wait_ms=1.0, compute_ms=7.0, input_share=0.1, verdict="not", measured_steps=100,
                           batch_size=8, slowest_stage=None, bottleneck=None, final_loss=None, client=None,
                           requests_per_image=None, bytes_per_image=None) for i, r in enumerate(rates)]

    cells = [figures([100.0, 101.0, 99.0]), figures([500.0, 520.0, 490.0]), figures([10.0, 10.1, 9.8]),
             figures([700.0])]  # one run: no variance, left out of the prior
    prior = variance_prior(cells)
    assert prior.cells == 3 and 0.005 < prior.typical_spread < 0.05
    assert variance_prior(cells[:2]) is None
    cell = Cell(format="files", store="gcs", latency="10ms", pipeline="seed", accelerator="emulated:1000",
                learning_rate=1e-4)
    result = CellResult(cell=cell, repeats_asked=3, runs=tuple(cells[0]), images_per_second=100.0,
                        images_per_second_interval=None, step_time_ms=None, input_wait_ms=None, compute_ms=None,
                        input_share=None, input_share_interval=None, verdict=None, bottleneck=None,
                        device_images_per_second=None, final_loss=None, client=None, requests_per_image=None,
                        bytes_per_image=None)
    assert pooling_note([result]) is None
    note = pooling_note([dataclasses.replace(result, variance_prior=prior)])
    assert note.startswith("intervals of images/s: each cell's run-to-run spread pooled with the 3 cells of this "
                           f"sweep (a typical run differs from its cell's geometric mean by {prior.typical_spread:.1%}")


def test_a_sweep_pools_its_input_shares_on_the_logit_scale():
    """The share's prior comes from the cells' logit variances, as the images/s one from their log
    variances; a cell's input-share interval is drawn towards the sweep's spread."""
    from stallscope.sweep.interval import logit_interval
    from stallscope.sweep.pooled_variance import logit_variance

    rng = random.Random(7)
    cells = [[min(0.999, max(0.001, centre + rng.gauss(0, 0.01))) for _ in range(3)]
             for centre in (0.1, 0.3, 0.5, 0.7, 0.9) * 3]
    prior = fit_prior([logit_variance(c) for c in cells])
    assert prior is not None and prior.cells == 15
    lucky = [0.500, 0.5001, 0.5002]  # three runs that agree by chance
    assert (logit_interval(lucky).high - logit_interval(lucky).low
            < logit_interval(lucky, prior=prior).high - logit_interval(lucky, prior=prior).low)
