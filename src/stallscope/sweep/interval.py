"""Intervals over a cell's repeats at 95%: Student's t-interval of the mean, of the geometric mean with a
pooled variance (images/s), of the mean logit with a pooled variance (input share), of a re-run's
geometric mean, and of the difference of two sweeps' means.

Repeats are few (2 to 10), so a bootstrap would have too few distinct resamples to mean much; the
t-interval is the textbook answer for a handful of roughly normal measurements. Images/s are taken on
the log scale, where their noise (a share of the rate) is alike between cells of 10 and of 900
images/s, and each cell's variance is pooled with the sweep's (sweep/pooled_variance.py). Pure: no
numpy or scipy (the quantiles below are the standard table's), so the core installation computes it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from stallscope.sweep.pooled_variance import VariancePrior, logit, pooled

CONFIDENCE = 0.95
# What a figure's bar or a table's interval is, said once for both figures.
BOTH_METHODS = ("95% t-intervals over repeats on the scale where cells' noise is alike (log images/s, the logit "
                "of input share), each cell's variance pooled with the sweep's cells (empirical Bayes)")
RERUN_METHOD = "where a re-run's geometric mean of as many repeats falls, 95% (a prediction interval, pooled variance)"
NO_INTERVAL = "no interval (one repeat)"

# Two-sided 95% quantiles of Student's t, t(0.975, df), for df = 1..30.
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
         2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
         2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = 1.959964


def t_quantile_975(df: float) -> float:
    """t(0.975, df): the table up to 30 (a fractional df read at the whole number below it: a little
    wide), then the Cornish-Fisher expansion around the normal (error < 1e-3); the normal's at inf."""
    if df < 1:
        raise ValueError(f"degrees of freedom: expected at least 1, got {df}")
    if math.isinf(df):
        return _Z975
    if df < len(_T975) + 1:
        return _T975[math.floor(df) - 1]
    z = _Z975
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclasses.dataclass(frozen=True)
class Interval:
    """The mean of `n` repeats and its 95% t-interval [low, high]."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        """Half the interval's width (of the clipped interval, where it was clipped)."""
        return (self.high - self.low) / 2


def t_interval(values: list[float], *, floor: float | None = None, ceiling: float | None = None) -> Interval | None:
    """The 95% t-interval of the mean of `values`, clipped to [floor, ceiling] where the quantity cannot
    go beyond (a share below 0); None with fewer than two values (no spread to go on)."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    low, high = mean - half, mean + half
    return Interval(mean=mean, low=low if floor is None else max(low, floor),
                    high=high if ceiling is None else min(high, ceiling), n=len(values))


def log_interval(values: list[float], *, prior: VariancePrior | None = None,
                 rerun_repeats: int | None = None) -> Interval | None:
    """The 95% t-interval of the geometric mean of positive `values` (images/s, whose noise is a share
    of them), with the variance of their logs pooled with the sweep's `prior` (sweep/pooled_variance.py).
    With `rerun_repeats`, the interval a re-run's geometric mean of that many repeats falls in at 95%
    (a prediction interval: this mean's uncertainty and the re-run's, sqrt(1/n + 1/m)). None with
    fewer than two values, or a value that is not positive."""
    if len(values) < 2 or min(values) <= 0:
        return None
    logs = [math.log(v) for v in values]
    variance, df = pooled(statistics.variance(logs), len(logs) - 1, prior)
    scale = 1.0 / len(logs) + (1.0 / rerun_repeats if rerun_repeats else 0.0)
    centre, half = statistics.fmean(logs), t_quantile_975(df) * math.sqrt(variance * scale)
    return Interval(mean=math.exp(centre), low=math.exp(centre - half), high=math.exp(centre + half), n=len(logs))


def logit_interval(shares: list[float], *, prior: VariancePrior | None = None) -> Interval | None:
    """The 95% t-interval of the mean logit of a cell's input shares (0..1), with their variance pooled
    with the sweep's `prior` (fit from `pooled_variance.logit_variance`), turned back into shares: it
    stays within 0..1 by itself, where a plain t-interval of two repeats (1 degree of freedom) spanned
    0-100%. `mean` is the share at the mean logit. None with fewer than two values."""
    if len(shares) < 2:
        return None
    logits = [logit(s) for s in shares]
    variance, df = pooled(statistics.variance(logits), len(logits) - 1, prior)
    centre, half = statistics.fmean(logits), t_quantile_975(df) * math.sqrt(variance / len(logits))

    def share(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-x))

    return Interval(mean=share(centre), low=share(centre - half), high=share(centre + half), n=len(logits))


def difference_interval(earlier: list[float], later: list[float]) -> Interval | None:
    """The 95% Welch t-interval of mean(later) - mean(earlier): whether two sweeps' repeats of one cell
    agree within the noise both show (it holds 0). The earlier sweep's own interval is of its mean
    alone; a re-run's mean falls inside that less often than 95% even where nothing changed (about 83%
    for many repeats), so it is the wrong test of a re-run. None with fewer than two values in either."""
    if len(earlier) < 2 or len(later) < 2:
        return None
    va, vb = statistics.variance(earlier) / len(earlier), statistics.variance(later) / len(later)
    difference = statistics.fmean(later) - statistics.fmean(earlier)
    if va + vb == 0:
        return Interval(mean=difference, low=difference, high=difference, n=len(earlier) + len(later))
    # Welch-Satterthwaite degrees of freedom, rounded down: the table's quantile is then a little wide
    df = (va + vb) ** 2 / (va ** 2 / (len(earlier) - 1) + vb ** 2 / (len(later) - 1))
    half = t_quantile_975(max(1, math.floor(df))) * math.sqrt(va + vb)
    return Interval(mean=difference, low=difference - half, high=difference + half, n=len(earlier) + len(later))
