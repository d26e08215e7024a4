"""A sweep's HTML report: the table of cells and two plots, PNGs embedded, one self-contained file.

Plots: images/s against per-request latency, one line per format and pipeline (a panel per
accelerator); input share against the accelerator's own speed, one line per format and pipeline,
with the 5% / 20% lines and each line's knee (where it crosses 20%).
"""

from __future__ import annotations

import html
from collections import defaultdict

from stallscope.report.html import _STYLE, _img, _table
from stallscope.report.plots import _figure, _png
from stallscope.sweep.grid import LOCAL, Grid, latency_seconds
from stallscope.sweep.knee import knee
from stallscope.sweep.results import CellResult
from stallscope.sweep.table import MARKDOWN_HEADER, markdown_cells
from stallscope.verdict import HIGHLY_INPUT_BOUND, MODERATELY_INPUT_BOUND

REPORT_NAME = "report.html"


def _latency_order(latencies) -> list[str]:
    return sorted(latencies, key=lambda l: -1.0 if l == LOCAL else latency_seconds(l))


def _line_label(result: CellResult, grid: Grid, *, with_latency: bool, with_accelerator: bool) -> str:
    cell, axes = result.cell, grid.axes
    parts = [cell.format, cell.pipeline]
    if with_latency and len(axes.latencies) > 1:
        parts.append(cell.latency)
    if with_accelerator and len(axes.accelerators) > 1:
        parts.append(cell.accelerator)
    if len(axes.learning_rates) > 1:
        parts.append(f"lr {cell.learning_rate:g}")
    return " / ".join(parts)


def throughput_vs_latency_png(results: list[CellResult], grid: Grid) -> bytes:
    """Images/s per latency (local disk first), a line per format and pipeline, a panel per accelerator."""
    plt = _figure()
    accelerators = list(grid.axes.accelerators)
    latencies = _latency_order(grid.axes.latencies)
    fig, axes = plt.subplots(1, len(accelerators), figsize=(4.2 * len(accelerators) + 1.5, 3.6), squeeze=False)
    for panel, accelerator in zip(axes[0], accelerators):
        lines: dict[str, dict[str, float]] = defaultdict(dict)
        for result in results:
            if result.cell.accelerator == accelerator and result.images_per_second is not None:
                label = _line_label(result, grid, with_latency=False, with_accelerator=False)
                lines[label][result.cell.latency] = result.images_per_second
        for label, by_latency in sorted(lines.items()):
            xs = [i for i, latency in enumerate(latencies) if latency in by_latency]
            panel.plot(xs, [by_latency[latencies[i]] for i in xs], marker="o", label=label)
        panel.set_xticks(range(len(latencies)), ["local disk" if l == LOCAL else l for l in latencies])
        panel.set_xlabel("per-request latency")
        panel.set_ylabel("images/s (median)")
        top = max((v for line in lines.values() for v in line.values()), default=1.0)
        panel.set_ylim(0, top * 1.12)
        panel.set_title(f"accelerator {accelerator}")
        panel.grid(alpha=0.3)
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    fig.suptitle("Throughput vs storage latency", y=1.04)  # above the panels' own titles
    return _png(fig)


def _knee_text(points: list[tuple[float, float]]) -> str:
    at = knee(points)
    if at is not None:
        return f"~{at:,.0f} images/s"
    if all(share < HIGHLY_INPUT_BOUND for _, share in points):
        return "under 20% at every speed swept" + (" (one speed)" if len(points) == 1 else "")
    if all(share >= HIGHLY_INPUT_BOUND for _, share in points):
        return "20% or more at every speed swept" + (" (one speed)" if len(points) == 1 else "")
    return "no single crossing (the share falls again at a faster speed)"


def input_share_vs_accelerator_png(results: list[CellResult], grid: Grid) -> tuple[bytes, list[tuple[str, str]]]:
    """Input share against device speed (batch / compute time), a line per format and pipeline (and
    latency); returns the PNG and each line's knee."""
    plt = _figure()
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for result in results:
        if result.device_images_per_second and result.input_share is not None:
            label = _line_label(result, grid, with_latency=True, with_accelerator=False)
            lines[label].append((result.device_images_per_second, result.input_share))
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    knees: list[tuple[str, str]] = []
    for label, points in sorted(lines.items()):
        points.sort()
        line, = ax.plot([p[0] for p in points], [p[1] * 100 for p in points], marker="o", label=label)
        at = knee(points)
        knees.append((label, _knee_text(points)))
        if at is not None:
            ax.axvline(at, color=line.get_color(), linestyle=":", alpha=0.8)
            ax.annotate(f"knee ~{at:,.0f}/s", (at, HIGHLY_INPUT_BOUND * 100), textcoords="offset points",
                        xytext=(4, 6), color=line.get_color(), fontsize="small")
    ax.axhline(HIGHLY_INPUT_BOUND * 100, color="#d62728", linewidth=1, label="highly input-bound (20%)")
    ax.axhline(MODERATELY_INPUT_BOUND * 100, color="#ff7f0e", linewidth=1, linestyle="--",
               label="moderately input-bound (5%)")
    speeds = [p[0] for points in lines.values() for p in points]
    if speeds and max(speeds) / min(speeds) > 3:
        ax.set_xscale("log")
    ax.set_xlabel("accelerator speed, images/s (emulated: as set; real: batch / compute time)")
    ax.set_ylabel("input share, % of step time")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    ax.set_title("Input share vs accelerator speed")
    return _png(fig), knees


def render_sweep_html(results: list[CellResult], grid: Grid, *, command: str, notes: list[str]) -> str:
    e = html.escape
    throughput = throughput_vs_latency_png(results, grid)
    share_png, knees = input_share_vs_accelerator_png(results, grid)
    rows = "".join(
        f"<tr class='cell' data-cell='{e(r.cell.name)}'>" + "".join(f"<td>{e(v)}</td>" for v in markdown_cells(r))
        + "</tr>" for r in results)
    head = "".join(f"<th>{e(h)}</th>" for h in MARKDOWN_HEADER)
    knee_rows = [[e(label), e(text)] for label, text in knees]
    axes = grid.axes
    grid_rows = [[name, e(", ".join(values))] for name, values in (
        ("format", axes.formats), ("latency", axes.latencies), ("pipeline", axes.pipelines),
        ("accelerator", axes.accelerators), ("learning rate", [f"{v:g}" for v in axes.learning_rates]))]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>stallscope sweep</title>"
        f"<style>{_STYLE}pre{{white-space:pre-wrap}}</style></head><body>",
        "<h1>Sweep</h1>",
        f"<pre>$ {e(command)}</pre>",
        _table(["axis", "values"], grid_rows),
        f"<p>{len(results)} cells x {grid.repeats} repeat(s), {grid.shared['steps']} steps each; medians over the "
        f"repeats; spread = (max - min) / median of images/s.</p>",
        f"<table id='cells'><tr>{head}</tr>{rows}</table>",
        "<h2>Throughput vs per-request latency</h2>",
        _img(throughput, "images/s vs per-request latency per format and pipeline"),
        "<h2>Input share vs accelerator speed</h2>",
        _img(share_png, "input share vs accelerator speed, the knee"),
        _table(["line", "knee: input share reaches 20%"], knee_rows),
    ]
    parts += [f"<p><i>note: {e(note)}</i></p>" for note in notes]
    parts.append("</body></html>")
    return "\n".join(parts)
