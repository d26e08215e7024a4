"""Where a pipeline stops keeping a device fed: the accelerator speed at which the input share
crosses the highly-input-bound line (20%), interpolated on a log scale of speed."""

from __future__ import annotations

import math

from stallscope.verdict import HIGHLY_INPUT_BOUND


def knee(points: list[tuple[float, float]], threshold: float = HIGHLY_INPUT_BOUND) -> float | None:
    """(device images/s, input share) points -> the speed where the share first reaches `threshold`
    going from slow to fast devices; None when no pair of points brackets it (all below or all above)."""
    ordered = sorted(p for p in points if p[0] > 0)
    for (slow, share_slow), (fast, share_fast) in zip(ordered, ordered[1:]):
        if share_slow < threshold <= share_fast:
            if share_fast == share_slow:
                return fast
            fraction = (threshold - share_slow) / (share_fast - share_slow)
            return math.exp(math.log(slow) + fraction * (math.log(fast) - math.log(slow)))
    return None
