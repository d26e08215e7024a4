"""Plots of an analysis as PNG bytes (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from stallscope.analysis.analyze import Analysis
from stallscope.report.drawing import figure_bytes as _png
from stallscope.report.drawing import pyplot as _figure
from stallscope.verdict import fmt_share, verdict_phrase


INPUT_COLOR = "#d62728"
COMPUTE_COLOR = "#1f77b4"


def step_bars_png(analysis: Analysis) -> bytes:
    return _png(step_bars_figure(analysis))


def step_bars_figure(analysis: Analysis):
    """Per-step stacked bars: input wait under compute; uncounted (first/last) steps faded. The legend
    sits right of the axes, where it cannot hide a bar."""
    plt = _figure()
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch

    steps = analysis.steps.steps
    fig, ax = plt.subplots(figsize=(8, 3.2))
    x = [s.step for s in steps]
    input_ms = [s.input_ms for s in steps]
    faded = [1.0 if s.counted else 0.35 for s in steps]
    ax.bar(x, input_ms, color=[to_rgba(INPUT_COLOR, a) for a in faded])
    ax.bar(x, [s.compute_ms for s in steps], bottom=input_ms, color=[to_rgba(COMPUTE_COLOR, a) for a in faded])
    ax.legend(handles=[Patch(color=INPUT_COLOR, label="input wait"), Patch(color=COMPUTE_COLOR, label="compute"),
                       Patch(color=to_rgba(COMPUTE_COLOR, 0.35), label="not counted (first/last)")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    if analysis.input_share is None:
        ax.set_title("Step time: input share not measurable (no iterator call inside the steps)")
    else:
        ax.set_title(f"Step time: input share {fmt_share(analysis.input_share)} ({verdict_phrase(analysis.verdict)})")
    return fig


BOTTLENECK_COLOR = INPUT_COLOR
SLOWEST_COLOR = "#404040"   # the slowest stage of a run that does not wait for input: marked, not alarming
STAGE_COLOR = "#a0a0a0"


def stage_bars_png(analysis: Analysis) -> bytes:
    return _png(stage_bars_figure(analysis))


def stage_bars_figure(analysis: Analysis):
    """Busy (wall-clock) time per tf.data stage, the figure the walk compares; the walk's stage in red
    when it holds the run back (input-bound), in dark grey when the input keeps up."""
    plt = _figure()
    stages = list(analysis.tree.stages)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(len(stages), 1)))
    names = [("  " * s.depth) + s.name for s in stages]
    marked = BOTTLENECK_COLOR if analysis.input_bound else SLOWEST_COLOR
    colors = [marked if s.long_name == analysis.tree.bottleneck else STAGE_COLOR for s in stages]
    ax.barh(range(len(stages)), [s.busy_ms for s in stages], color=colors)
    ax.set_yticks(range(len(stages)), names)
    ax.invert_yaxis()
    ax.set_xlabel("busy, ms (wall-clock time of the stage's own work)")
    if analysis.input_bound:
        label = "bottleneck in red"
    elif analysis.input_share is None:
        label = "slowest stage in dark grey; whether the input keeps up is not measured"
    else:
        label = "slowest stage in dark grey; the input keeps up"
    ax.set_title(f"tf.data stages, outermost first ({label})")
    return fig
