"""XProf's input-bound classification, shared by the workload summary and the analysis."""

from __future__ import annotations

import math

HIGHLY_INPUT_BOUND = 0.20      # XProf: "highly input-bound" at or above 20% of step time
MODERATELY_INPUT_BOUND = 0.05  # XProf: "moderately input-bound" at or above 5%
VERDICTS = ("highly", "moderately", "not")
NOT_MEASURED = "n/a"


def verdict_for(input_share: float) -> str:
    """'highly', 'moderately' or 'not' input-bound, from input wait / step time (0..1)."""
    if input_share >= HIGHLY_INPUT_BOUND:
        return "highly"
    if input_share >= MODERATELY_INPUT_BOUND:
        return "moderately"
    return "not"


def fmt_share(input_share: float | None, digits: int = 1) -> str:
    """'4.7%': a share as a percentage that never contradicts its verdict. Rounding half up would
    print 0.0496 as '5.0%' beside 'not input-bound'; a share that rounds up onto a threshold it is
    below is rounded down instead ('4.9%'). None (not measured) is 'n/a', never a number."""
    if input_share is None or not math.isfinite(input_share):
        return NOT_MEASURED
    scale = 10 ** digits
    shown = round(input_share * 100 * scale) / scale
    if verdict_for(shown / 100) != verdict_for(input_share):
        shown = math.floor(input_share * 100 * scale) / scale
    return f"{shown:.{digits}f}%"


def verdict_phrase(verdict: str | None) -> str:
    """'not input-bound'; 'input-bound or not: not measured' for no verdict."""
    return "input-bound or not: not measured" if verdict is None else f"{verdict} input-bound"
