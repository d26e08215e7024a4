"""A sweep's figures, drawn from its CellResults: what a paper can print.

- Throughput against the latency an emulated store adds per request, on a log axis at the true values.
  A log axis has no 0: local disk and an added 0 ms are drawn at two labelled points left of the
  smallest latency swept, local disk apart behind a dotted line.
- Images/s of each format over files' in the same cell otherwise, per store and latency (the seeds'
  question as one picture), where the sweep has files and another format.
- Input share against accelerator speed (with each line's knee) where the sweep has two speeds or more;
  with one speed, input share against latency instead (a speed plot would be one column of points).

Every point is a cell's median; its bar the 95% interval the table gives (pooled, on the log scale for
images/s and the logit for input share); small dots each repeat. A line is a format and pipeline (its colour) on one store through one client (its marker
and dash); the legend names all four. Latency figures have a panel per store (local disk drawn in each),
on the same axes.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

from stallscope.report.drawing import figure_bytes, pyplot
from stallscope.sweep.figures import LOCAL, STORE_LABELS, STORES, CellResult
from stallscope.sweep.interval import difference_interval
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


@dataclasses.dataclass(frozen=True)
class Panel:
    """One facet: its axes, the accelerator and the store it shows (None: every store, where the sweep
    has one store or only local disk), and its title."""

    ax: object
    accelerator: str
    store: str | None
    title: str

    def holds(self, result: CellResult) -> bool:
        """The cells drawn here: this accelerator's, on this store or on local disk (every panel's
        reference point at the left of its axis)."""
        cell = result.cell
        return cell.accelerator == self.accelerator and (self.store is None or cell.store in (self.store, LOCAL))


def _panels(results: list[CellResult], width: float, height: float) -> tuple[object, list[Panel]]:
    """A panel per store that adds latency (local disk drawn in each) and per accelerator, all on the same
    axes: 16 series in one panel were told apart only by marker. One panel where there is one store."""
    plt = pyplot()
    accelerators = list(dict.fromkeys(r.cell.accelerator for r in results))
    stores = [s for s in STORES if s != LOCAL and any(r.cell.store == s for r in results)]
    columns = stores if len(stores) > 1 else [None]
    fig, axes = plt.subplots(len(accelerators), len(columns), figsize=(width * len(columns) + 2.5, height * len(accelerators)),
                             squeeze=False, sharex=True, sharey=True)
    panels = []
    for row, accelerator in enumerate(accelerators):
        for column, store in enumerate(columns):
            parts = ([STORE_LABELS[store]] if store else []) + ([f"accelerator {accelerator}"] if len(accelerators) > 1
                                                               or store is None else [])
            panels.append(Panel(axes[row][column], accelerator, store, ", ".join(parts)))
    return fig, panels


def _facet_note(panels: list[Panel]) -> str:
    if not any(p.store for p in panels):
        return ""
    return "a panel per store, on the same axes; local disk, where swept, at the left of each"


def _legend(fig, ax, panels: list[Panel] | None = None, title: str = "format / pipeline on store via client") -> None:
    """One legend for the figure, right of `ax`, of every panel's series."""
    unique: dict = {}
    for source in [p.ax for p in panels] if panels else [ax]:
        handles, labels = source.get_legend_handles_labels()
        unique.update((label, handle) for label, handle in zip(labels, handles) if label not in unique)
    ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small",
              title=title, title_fontsize="small")


def throughput_vs_latency(results: list[CellResult]) -> Drawn:
    axis = LatencyAxis.of(results)
    fig, panels = _panels(results, 4.6, 3.8)
    medians = [r.images_per_second for r in results if r.images_per_second]
    log_y = bool(medians) and max(medians) / min(medians) >= 10
    for panel in panels:
        ax = panel.ax
        mine = [r for r in results if panel.holds(r)]
        _draw(ax, mine, results, axis.x, _images_per_second, lambda r: [run.images_per_second for run in r.runs],
              with_latency=False)
        axis.dress(ax, results)
        if log_y:
            _log_y(ax)
        else:
            ax.set_ylim(bottom=0)
        ax.set_ylabel("images/s" + (" (log scale)" if log_y else ""))
        ax.set_title(panel.title, fontsize="medium")
        ax.grid(alpha=0.3, which="both")
    _legend(fig, panels[-1].ax, panels)
    caption = "; ".join(p for p in (POINTS_NOTE, _facet_note(panels), axis.caption(results)) if p)
    return Drawn(fig, caption)


def _log_y(ax) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 30, not 3 x 10^1
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))


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
    for panel in panels:
        ax = panel.ax
        _draw(ax, [r for r in results if panel.holds(r)], results, axis.x, _share_pct,
              lambda r: [run.input_share * 100 for run in r.runs], with_latency=False)
        axis.dress(ax, results)
        _share_lines(ax)
        ax.set_title(panel.title, fontsize="medium")
    _legend(fig, panels[-1].ax, panels)
    caption = "; ".join(p for p in (POINTS_NOTE, _facet_note(panels), axis.caption(results),
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


BASELINE_FORMAT = "files"  # what every other format's speedup is over: the seeds' question


@dataclasses.dataclass(frozen=True)
class Speedup:
    """One format's images/s over files' in the same cell otherwise (store, latency, pipeline, ...): the
    ratio of their geometric means and its 95% Welch interval (of the difference of their mean logs)."""

    over: CellResult        # the cell of the other format
    baseline: CellResult    # the files cell it is set against
    ratio: float
    low: float | None
    high: float | None


def speedups(results: list[CellResult]) -> list[Speedup]:
    """Every cell of another format that has a files cell to set against, each with complete runs."""
    def twin(cell, fmt: str) -> tuple:
        return (fmt, cell.store, cell.latency, cell.bandwidth_bps, cell.pipeline, cell.accelerator,
                cell.learning_rate, cell.cold)

    files = {twin(r.cell, r.cell.format): r for r in results if r.cell.format == BASELINE_FORMAT and r.repeats}
    found = []
    for result in results:
        base = files.get(twin(result.cell, BASELINE_FORMAT))
        if result.cell.format == BASELINE_FORMAT or base is None or not result.repeats:
            continue
        mine = [math.log(run.images_per_second) for run in result.runs if run.images_per_second > 0]
        theirs = [math.log(run.images_per_second) for run in base.runs if run.images_per_second > 0]
        if not mine or not theirs:
            continue
        ratio = math.exp(sum(mine) / len(mine) - sum(theirs) / len(theirs))
        interval = difference_interval(theirs, mine)
        found.append(Speedup(result, base, ratio, interval and math.exp(interval.low),
                             interval and math.exp(interval.high)))
    return found


def speedup_vs_latency(results: list[CellResult]) -> Drawn:
    """The seeds' question as one picture: each format's images/s over files', per store and latency;
    a line per format and pipeline (colour) on one store (marker); 1x is the files' own."""
    plt = pyplot()
    found = speedups(results)
    axis = LatencyAxis.of([s.over for s in found])
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    groups = sorted({f"{s.over.cell.format} / {s.over.cell.pipeline}" for s in found})
    colours = {g: f"C{i % 10}" for i, g in enumerate(groups)}
    series: dict[tuple[str, str], list[Speedup]] = defaultdict(list)
    for item in found:
        group = f"{item.over.cell.format} / {item.over.cell.pipeline}"
        series[(group, item.over.cell.store)].append(item)
    for (group, store), members in sorted(series.items()):
        members.sort(key=lambda s: axis.x(s.over))
        xs = [axis.x(s.over) for s in members]
        label = f"{group} over files on {STORE_LABELS[store]}"
        ax.plot(xs, [s.ratio for s in members], color=colours[group], marker=_MARKERS.get(store, "o"),
                linestyle=_DASHES.get(store, "-"), label=label)
        for x, item in zip(xs, members):
            if item.low is not None:
                ax.errorbar([x], [item.ratio], yerr=[[item.ratio - item.low], [item.high - item.ratio]],
                            color=colours[group], capsize=3, linewidth=1, fmt="none")
    ax.axhline(1.0, color="#555555", linewidth=1, linestyle=":", label="as fast as files")
    axis.dress(ax, [s.over for s in found])
    _log_y(ax)
    ax.set_ylabel("images/s over files' (log scale)")
    ax.grid(alpha=0.3, which="both")
    _legend(fig, ax, title="format / pipeline over files on store")
    caption = "; ".join(p for p in (
        "point: the ratio of the two cells' geometric means of images/s; bar: its 95% Welch t-interval (of the "
        "difference of their mean log images/s); above 1: faster than the same cell read as files",
        axis.caption([s.over for s in found])) if p)
    return Drawn(fig, caption)


PLOTS = {  # name (the files' too): (heading, drawing)
    "throughput_vs_latency": ("Throughput vs latency per request", throughput_vs_latency),
    "speedup_vs_latency": ("Speedup over files per store and latency", speedup_vs_latency),
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
    names = ["throughput_vs_latency"]
    if speedups(measured):
        names.append("speedup_vs_latency")
    return names + ["input_share_vs_speed" if len(speeds) > 1 else "input_share_vs_latency"]


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
