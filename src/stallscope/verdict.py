"""XProf's input-bound classification, shared by the workload summary and the analysis."""

from __future__ import annotations

HIGHLY_INPUT_BOUND = 0.20      # XProf: "highly input-bound" at or above 20% of step time
MODERATELY_INPUT_BOUND = 0.05  # XProf: "moderately input-bound" at or above 5%
VERDICTS = ("highly", "moderately", "not")


def verdict_for(input_share: float) -> str:
    """'highly', 'moderately' or 'not' input-bound, from input wait / step time (0..1)."""
    if input_share >= HIGHLY_INPUT_BOUND:
        return "highly"
    if input_share >= MODERATELY_INPUT_BOUND:
        return "moderately"
    return "not"
