"""A cell's run-to-run variance, pooled with the sweep's other cells (empirical Bayes, Smyth 2004).

Three repeats give a variance with two degrees of freedom: one cell in twenty has its three runs agree
to a fifth of their true spread by chance alone, and a t-interval over them is then too narrow to hold
a re-run (three gs:// runs at 726.9, 727.8 and 728.2 images/s gave 726-729; the same cell re-run gave
699). Throughput's noise is multiplicative, so on the log scale the cells of one sweep share a typical
relative spread. Each cell's variance is drawn towards it, as limma's moderated t does for genes: the
sweep's cells fit a scaled inverse-chi-square prior (`d0` degrees of freedom around `s0^2`) by the
moments of their log variances, and a cell's pooled variance is (d0 s0^2 + d s^2) / (d0 + d) with
d0 + d degrees of freedom. Cells whose spreads really differ give a small d0 and keep their own.
Input shares are pooled the same way on the logit scale, where a share near 0 or 100% (which cannot
move far that way) and one in the middle have alike noise.

Pure Python (digamma, trigamma and its inverse by their series), so the core installation computes it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

MIN_CELLS = 3  # fewer cells say nothing of how variances spread between cells: each keeps its own


@dataclasses.dataclass(frozen=True)
class VariancePrior:
    """The sweep's typical variance of a cell's log images/s (`variance`) and how much a cell's own
    estimate is worth against it (`df`; math.inf: every cell's spread is the same up to chance)."""

    variance: float
    df: float
    cells: int

    @property
    def typical_spread(self) -> float:
        """The typical relative standard deviation of a run's images/s (0.012: 1.2%)."""
        return math.sqrt(self.variance)


def digamma(x: float) -> float:
    shift = 0.0
    while x < 6.0:
        shift -= 1.0 / x
        x += 1.0
    f = 1.0 / (x * x)
    return shift + math.log(x) - 0.5 / x - f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f * (1 / 240 - f / 132))))


def trigamma(x: float) -> float:
    shift = 0.0
    while x < 6.0:
        shift += 1.0 / (x * x)
        x += 1.0
    f = 1.0 / (x * x)
    return shift + 1.0 / x + f / 2 + f / x * (1 / 6 - f * (1 / 30 - f * (1 / 42 - f * (1 / 30 - f * 5 / 66))))


def _tetragamma(x: float) -> float:
    shift = 0.0
    while x < 6.0:
        shift -= 2.0 / (x * x * x)
        x += 1.0
    f = 1.0 / (x * x)
    return shift - f - f / x - f * f * (0.5 - f * (1 / 6 - f * (1 / 6 - f * (3 / 10 - f * 5 / 6))))


def trigamma_inverse(y: float) -> float:
    """The x > 0 with trigamma(x) = y, by Newton's method on 1/trigamma (as limma does)."""
    if y > 1e7:
        return 1.0 / math.sqrt(y)
    if y < 1e-6:
        return 1.0 / y
    x = 0.5 + 1.0 / y
    for _ in range(100):
        tri = trigamma(x)
        step = tri * (1.0 - tri / y) / _tetragamma(x)
        x += step
        if -step / x < 1e-8:
            break
    return x


def log_variance(rates: Sequence[float]) -> tuple[float, int]:
    """(sample variance of the logs of a cell's images/s, its degrees of freedom); df 0 where it has none
    (one run, or a rate that is not positive)."""
    if len(rates) < 2 or min(rates) <= 0:
        return 0.0, 0
    return statistics.variance([math.log(r) for r in rates]), len(rates) - 1


# An input share of exactly 0 or 1 has no logit: shares are held within 0.1% of either end first (a run
# wholly input-bound reads as 99.9%).
SHARE_EDGE = 0.001


def logit(share: float) -> float:
    """log(p / (1 - p)) of a share held within SHARE_EDGE of 0 and 1: the scale on which input shares
    of 10% and of 97% have alike noise (a share near either end cannot move far that way)."""
    p = min(max(share, SHARE_EDGE), 1.0 - SHARE_EDGE)
    return math.log(p / (1.0 - p))


def logit_variance(shares: Sequence[float]) -> tuple[float, int]:
    """(sample variance of the logits of a cell's input shares, its degrees of freedom); df 0 with one run."""
    if len(shares) < 2:
        return 0.0, 0
    return statistics.variance([logit(s) for s in shares]), len(shares) - 1


def fit_prior(cells: Sequence[tuple[float, int]]) -> VariancePrior | None:
    """The prior from each cell's (sample variance of its log images/s, its degrees of freedom), cells
    with fewer than two runs left out; None with fewer than MIN_CELLS such cells."""
    usable = [(variance, df) for variance, df in cells if df >= 1 and variance >= 0 and math.isfinite(variance)]
    if len(usable) < MIN_CELLS:
        return None
    middle = statistics.median(v for v, _ in usable)
    floor = 1e-5 * middle if middle > 0 else 1e-12  # a cell whose runs agree exactly: not log(0)
    e = [math.log(max(v, floor)) - digamma(df / 2) + math.log(df / 2) for v, df in usable]
    mean = statistics.fmean(e)
    excess = statistics.variance(e) - statistics.fmean(trigamma(df / 2) for _, df in usable)
    if excess <= 0:
        return VariancePrior(variance=math.exp(mean), df=math.inf, cells=len(usable))
    df0 = 2.0 * trigamma_inverse(excess)
    return VariancePrior(variance=math.exp(mean + digamma(df0 / 2) - math.log(df0 / 2)), df=df0, cells=len(usable))


def pooled(variance: float, df: int, prior: VariancePrior | None) -> tuple[float, float]:
    """A cell's (variance, degrees of freedom) drawn towards the prior; its own without one."""
    if prior is None:
        return variance, float(df)
    if math.isinf(prior.df):
        return prior.variance, math.inf
    return (prior.df * prior.variance + df * variance) / (prior.df + df), prior.df + df
