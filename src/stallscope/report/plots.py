"""Plots of an analysis as PNG bytes (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import io

from stallscope.analysis.analyze import Analysis


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    _figure().close(fig)
    return buffer.getvalue()


def step_bars_png(analysis: Analysis) -> bytes:
    """Per-step stacked bars: input wait under compute; uncounted (first/last) steps faded."""
    plt = _figure()
    steps = analysis.steps.steps
    fig, ax = plt.subplots(figsize=(8, 3.2))
    x = [s.step for s in steps]
    alpha = [1.0 if s.counted else 0.35 for s in steps]
    for xi, s, a in zip(x, steps, alpha):
        ax.bar(xi, s.input_ms, color="#d62728", alpha=a)
        ax.bar(xi, s.compute_ms, bottom=s.input_ms, color="#1f77b4", alpha=a)
    ax.bar([], [], color="#d62728", label="input wait")
    ax.bar([], [], color="#1f77b4", label="compute")
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.set_title(f"Step time: input share {analysis.input_share * 100:.1f}% ({analysis.verdict} input-bound)")
    ax.legend(loc="upper right")
    return _png(fig)


def stage_bars_png(analysis: Analysis) -> bytes:
    """Own time per tf.data stage, the bottleneck highlighted."""
    plt = _figure()
    stages = list(analysis.tree.stages)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(len(stages), 1)))
    names = [("  " * s.depth) + s.name for s in stages]
    colors = ["#d62728" if s.long_name == analysis.tree.bottleneck else "#7f7f7f" for s in stages]
    ax.barh(names, [s.own_ms for s in stages], color=colors)
    ax.invert_yaxis()
    ax.set_xlabel("own time, ms (summed over calls)")
    ax.set_title("tf.data stages, outermost first (bottleneck in red)")
    return _png(fig)
