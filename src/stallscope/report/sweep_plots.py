"""A sweep's figures, drawn from its CellResults: what a paper can print.

- Throughput against the latency an emulated store adds per request, on a log axis at the true values.
  A log axis has no 0: local disk and an added 0 ms are drawn at two labelled points left of the
  smallest latency swept, local disk apart behind a dotted line.
- Input share against accelerator speed (with each line's knee) where the sweep has two speeds or more;
  with one speed, input share against latency instead (a speed plot would be one column of points).

Every point is a cell's median; its bar the 95% interval the table gives (pooled, on the log scale for
images/s and the logit for input share); small dots each repeat. A line is a format and pipeline (its colour) on one store through one client (its marker
and dash); the legend names all four.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from stallscope.report.drawing import figure_bytes, pyplot
from stallscope.sweep.figures import LOCAL, CellResult
from stallscope.sweep.knee import knee
from stallscope.verdict import HIGHLY_INPUT_BOUND, MODERATELY_INPUT_BOUND

_MARKERS = {LOCAL: "s", "gcs": "o", "s3": "^", "mount": "D"}
_DASHES = {LOCAL: "", "gcs": "-", "s3": "--", "mount": "-."}
POINTS_NOTE = ("point: median over repeats; bar: 95% interval (the table's: t-intervals on the log scale for images/s, "
               "the logit for input share, each cell's variance pooled with the sweep's); small dots: each repeat")


@dataclasses.dataclass(frozen=True)
class SweepFigure:
    """One figure, rendered: a file name (no suffix), its heading, its caption, PNG and PDF bytes."""

    name: str
    title: str
    caption: str
    png: bytes
    pdf: bytes
    table: tuple[tuple[str, str], ...] = ()  # rows shown under it (the knees)


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A figure still open (matplotlib's), with its caption and the rows shown under it."""

    fig: object
    caption: str
    table: tuple[tuple[str, str], ...] = ()


def _varies(results: list[CellResult], attribute) -> bool:
    return len({attribute(r) for r in results}) > 1


def _group(result: CellResult, results: list[CellResult]) -> str:
    """The colour's name: format and pipeline (and learning rate where the sweep varies it)."""
    cell = result.cell
    parts = [cell.format, cell.pipeline]
    if _varies(results, lambda r: r.cell.learning_rate):
        parts.append(f"lr {cell.learning_rate:g}")
    return " / ".join(parts)


def _series(result: CellResult, results: list[CellResult], *, with_latency: bool) -> tuple[str, str]:
    """(colour group, legend label): '... on gs:// via TF gs://'; with_latency names the latency too."""
    cell = result.cell
    where = cell.where if with_latency or cell.store == LOCAL else cell.where.replace(f" {cell.latency}", "", 1)
    via = f" via {result.client}" if result.client else ""
    return _group(result, results), f"{_group(result, results)} on {where}{via}"


@dataclasses.dataclass(frozen=True)
class LatencyAxis:
    """Where each cell sits on the log latency axis, and the ticks: true values for the latencies swept,
    labelled stand-ins for local disk and 0 ms."""

    zero_at: float
    local_at: float

    @classmethod
    def of(cls, results: list[CellResult]) -> "LatencyAxis":
        positive = [r.cell.latency_ms for r in results if r.cell.latency_ms]
        zero_at = min(positive) / 10 if positive else 0.1
        return cls(zero_at=zero_at, local_at=zero_at / 4)

    def x(self, result: CellResult) -> float:
        ms = result.cell.latency_ms
        return self.local_at if ms is None else (self.zero_at if ms == 0 else ms)

    def dress(self, ax, results: list[CellResult]) -> None:
        ax.set_xscale("log")
        ticks: dict[float, str] = {}
        for result in results:
            ms = result.cell.latency_ms
            ticks[self.x(result)] = "local\ndisk" if ms is None else f"{ms:g} ms"
        ax.set_xticks(sorted(ticks), [ticks[t] for t in sorted(ticks)])
        ax.minorticks_off()
        if any(r.cell.latency_ms is None for r in results) and len(ticks) > 1:
            ax.axvline((self.local_at * self.zero_at) ** 0.5, color="#999999", linestyle=":", linewidth=1)
        low, high = min(ticks), max(ticks)
        ax.set_xlim(low / 1.8, high * 1.8)
        ax.set_xlabel("latency added per request (log scale)")

    def caption(self, results: list[CellResult]) -> str:
        parts = []
        if any(r.cell.latency_ms is None for r in results):
            parts.append(f"local disk is drawn at {self.local_at:g} ms, apart behind the dotted line")
        if any(r.cell.latency_ms == 0 for r in results):
            parts.append(f"an added 0 ms at {self.zero_at:g} ms")
        return ("; ".join(parts) + " (a log axis has no 0)") if parts else ""


def _draw(ax, results: list[CellResult], all_results: list[CellResult], x_of, y_of, runs_of, *,
          with_latency: bool) -> None:
    """Medians joined per series, their 95% intervals as bars, every repeat as a dot."""
    groups = sorted({_group(r, all_results) for r in all_results})
    colours = {g: f"C{i % 10}" for i, g in enumerate(groups)}
    series: dict[tuple[str, str, str], list[CellResult]] = defaultdict(list)
    for result in results:
        if result.repeats:
            group, label = _series(result, all_results, with_latency=with_latency)
            series[(group, label, result.cell.store)].append(result)
    for (group, label, store), members in sorted(series.items()):
        members.sort(key=x_of)
        xs = [x_of(r) for r in members]
        medians = [y_of(r)[0] for r in members]
        colour = colours[group]
        ax.plot(xs, medians, color=colour, marker=_MARKERS.get(store, "o"), linestyle=_DASHES.get(store, "-"),
                label=label)
        for x, r in zip(xs, members):
            _, interval = y_of(r)
            if interval is not None:
                ax.errorbar([x], [interval[0]], yerr=[[interval[0] - interval[1]], [interval[2] - interval[0]]],
                            color=colour, capsize=3, linewidth=1, fmt="none")
            values = runs_of(r)
            ax.scatter([x] * len(values), values, color=colour, s=10, alpha=0.45, linewidths=0)


def _images_per_second(r: CellResult):
    i = r.images_per_second_interval
    return r.images_per_second, None if i is None else (i.mean, max(i.low, 0.0), i.high)


def _share_pct(r: CellResult):
    i = r.input_share_interval
    median = None if r.input_share is None else r.input_share * 100
    return median, None if i is None else (i.mean * 100, max(i.low, 0.0) * 100, min(i.high, 1.0) * 100)


def _panels(results: list[CellResult], width: float, height: float):
    """A panel per accelerator where the sweep has several, one otherwise."""
    plt = pyplot()
    accelerators = list(dict.fromkeys(r.cell.accelerator for r in results))
    fig, axes = plt.subplots(1, len(accelerators), figsize=(width * len(accelerators) + 2.5, height), squeeze=False,
                             sharey=True)
    return fig, list(zip(axes[0], accelerators))


def _legend(fig, ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small",
              title="format / pipeline on store via client", title_fontsize="small")


def throughput_vs_latency(results: list[CellResult]) -> Drawn:
    axis = LatencyAxis.of(results)
    fig, panels = _panels(results, 4.6, 3.8)
    medians = [r.images_per_second for r in results if r.images_per_second]
    log_y = bool(medians) and max(medians) / min(medians) >= 10
    for ax, accelerator in panels:
        mine = [r for r in results if r.cell.accelerator == accelerator]
        _draw(ax, mine, results, axis.x, _images_per_second, lambda r: [run.images_per_second for run in r.runs],
              with_latency=False)
        axis.dress(ax, results)
        if log_y:
            from matplotlib.ticker import FuncFormatter

            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 30, not 3 x 10^1
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
        else:
            ax.set_ylim(bottom=0)
        ax.set_ylabel("images/s" + (" (log scale)" if log_y else ""))
        ax.set_title(f"accelerator {accelerator}", fontsize="medium")
        ax.grid(alpha=0.3, which="both")
    _legend(fig, panels[-1][0])
    caption = "; ".join(p for p in (POINTS_NOTE, axis.caption(results)) if p)
    return Drawn(fig, caption)


def _share_lines(ax) -> None:
    ax.axhline(HIGHLY_INPUT_BOUND * 100, color="#d62728", linewidth=1, label="highly input-bound (20%)")
    ax.axhline(MODERATELY_INPUT_BOUND * 100, color="#ff7f0e", linewidth=1, linestyle="--",
               label="moderately input-bound (5%)")
    ax.set_ylabel("input share, % of step time")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3, which="both")


def input_share_vs_latency(results: list[CellResult]) -> Drawn:
    axis = LatencyAxis.of(results)
    fig, panels = _panels(results, 4.6, 3.8)
    for ax, accelerator in panels:
        mine = [r for r in results if r.cell.accelerator == accelerator]
        _draw(ax, mine, results, axis.x, _share_pct, lambda r: [run.input_share * 100 for run in r.runs],
              with_latency=False)
        axis.dress(ax, results)
        _share_lines(ax)
        ax.set_title(f"accelerator {accelerator}", fontsize="medium")
    _legend(fig, panels[-1][0])
    caption = "; ".join(p for p in (POINTS_NOTE, axis.caption(results),
                                    "one accelerator speed: input share is drawn against latency") if p)
    return Drawn(fig, caption)


def _knee_text(points: list[tuple[float, float]]) -> str:
    at = knee(points)
    if at is not None:
        return f"~{at:,.0f} images/s"
    if all(share < HIGHLY_INPUT_BOUND for _, share in points):
        return "under 20% at every speed swept"
    if all(share >= HIGHLY_INPUT_BOUND for _, share in points):
        return "20% or more at every speed swept"
    return "no single crossing (the share falls again at a faster speed)"


def input_share_vs_speed(results: list[CellResult]) -> Drawn:
    """Input share against the device's own speed, a line per format, pipeline and store; the knees."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    measured = [r for r in results if r.device_images_per_second and r.input_share is not None]
    _draw(ax, measured, results, lambda r: r.device_images_per_second, _share_pct,
          lambda r: [run.input_share * 100 for run in r.runs], with_latency=True)
    knees: list[tuple[str, str]] = []
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in measured:
        lines[_series(r, results, with_latency=True)[1]].append((r.device_images_per_second, r.input_share))
    for label, points in sorted(lines.items()):
        knees.append((label, _knee_text(points)))
        at = knee(points)
        if at is not None:
            ax.axvline(at, color="#555555", linestyle=":", alpha=0.8)
            ax.annotate(f"knee ~{at:,.0f}/s", (at, HIGHLY_INPUT_BOUND * 100), textcoords="offset points",
                        xytext=(4, 6), fontsize="small")
    speeds = [r.device_images_per_second for r in measured]
    if speeds and max(speeds) / min(speeds) > 3:
        ax.set_xscale("log")
    ax.set_xlabel("accelerator speed, images/s (emulated: as set; real: batch / compute time)")
    _share_lines(ax)
    _legend(fig, ax)
    return Drawn(fig, POINTS_NOTE, tuple(knees))


PLOTS = {  # name (the files' too): (heading, drawing)
    "throughput_vs_latency": ("Throughput vs latency per request", throughput_vs_latency),
    "input_share_vs_latency": ("Input share vs latency per request", input_share_vs_latency),
    "input_share_vs_speed": ("Input share vs accelerator speed", input_share_vs_speed),
}


def plots_supported(results: list[CellResult]) -> list[str]:
    """The plots the data supports: none without a complete run; input share against speed only where
    two speeds or more were swept (else against latency)."""
    measured = [r for r in results if r.repeats]
    if not measured:
        return []
    speeds = {r.device_images_per_second for r in measured if r.device_images_per_second}
    return ["throughput_vs_latency", "input_share_vs_speed" if len(speeds) > 1 else "input_share_vs_latency"]


def sweep_figures(results: list[CellResult]) -> list[SweepFigure]:
    """Each supported plot drawn from the cells with a complete run, as PNG and PDF."""
    measured = [r for r in results if r.repeats]
    figures = []
    for name in plots_supported(results):
        title, draw = PLOTS[name]
        drawn = draw(measured)
        pdf = figure_bytes(drawn.fig, "pdf", close=False)
        figures.append(SweepFigure(name=name, title=title, caption=drawn.caption,
                                   png=figure_bytes(drawn.fig, "png"), pdf=pdf, table=drawn.table))
    return figures
