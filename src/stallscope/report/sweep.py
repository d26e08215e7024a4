"""A sweep's HTML report: the table of cells (median, 95% interval) and the figures the data supports,
PNGs embedded so the page is one file; the same figures written as PNG and PDF into figures/ beside it.

It renders what it is given (CellResults, plain data): it reads no run and imports no workload code.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

from stallscope.report.html_page import STYLE, img_tag, table_html
from stallscope.report.sweep_plots import SweepFigure, sweep_figures
from stallscope.sweep.figures import CellResult
from stallscope.sweep.table import MARKDOWN_HEADER, TABLE_NOTE, markdown_cells

REPORT_NAME = "report.html"
FIGURES_DIR = "figures"
# The sweep's table is wide (16 columns): the page takes the window's width, and the table scrolls
# inside its own box on a narrower one instead of being cut off at the page's edge.
_WIDE = ("body{max-width:none;margin:1.5em}.scroll{overflow-x:auto;max-width:100%}#cells{font-size:90%}"
         "#cells td{white-space:nowrap}#cells th{vertical-align:bottom}figure{margin:1em 0}figcaption{font-size:90%;color:#444}")


def _axes_rows(results: list[CellResult]) -> list[list[str]]:
    """Each axis and the values it took, in the cells' order."""
    def values(attribute) -> str:
        return html.escape(", ".join(dict.fromkeys(str(attribute(r.cell)) for r in results)))

    return [["format", values(lambda c: c.format)], ["store", values(lambda c: c.where.split(" ")[0]
                                                                    if c.store != "local" else "local disk")],
            ["latency per request", values(lambda c: "-" if c.store == "local" else c.latency)],
            ["pipeline", values(lambda c: c.pipeline)], ["accelerator", values(lambda c: c.accelerator)],
            ["learning rate", values(lambda c: f"{c.learning_rate:g}")],
            ["start", values(lambda c: "cold (--cold)" if c.cold else "page cache as found")]]


def _figure_html(figure: SweepFigure) -> str:
    e = html.escape
    parts = [f"<h2>{e(figure.title)}</h2>", f"<figure id='{e(figure.name)}'>", img_tag(figure.png, figure.title),
             f"<figcaption>{e(figure.caption)}. Files: {FIGURES_DIR}/{e(figure.name)}.png, "
             f"{FIGURES_DIR}/{e(figure.name)}.pdf</figcaption></figure>"]
    if figure.table:
        parts.append(table_html(["line", "knee: input share reaches 20%"],
                                [[e(label), e(text)] for label, text in figure.table]))
    return "\n".join(parts)


def render_sweep_html(results: list[CellResult], figures: list[SweepFigure], *, repeats: int, steps: int | None,
                      command: str, notes: list[str]) -> str:
    """The page; `steps` None: each run ran to a --precision (the notes say which)."""
    e = html.escape
    rows = "".join(
        f"<tr class='cell' data-cell='{e(r.cell.name)}'>" + "".join(f"<td>{e(v)}</td>" for v in markdown_cells(r))
        + "</tr>" for r in results)
    head = "".join(f"<th>{e(h)}</th>" for h in MARKDOWN_HEADER)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>stallscope sweep</title>"
        f"<style>{STYLE}{_WIDE}pre{{white-space:pre-wrap}}</style></head><body>",
        "<h1>Sweep</h1>",
        f"<pre>$ {e(command)}</pre>",
        table_html(["axis", "values"], _axes_rows(results)),
        f"<p>{len(results)} cells x {repeat_text(repeats, steps)}. {e(TABLE_NOTE)}</p>",
        f"<div class='scroll'><table id='cells'><tr>{head}</tr>{rows}</table></div>",
    ]
    parts += [_figure_html(figure) for figure in figures]
    if not figures:
        parts.append("<p>No figures: no cell has a complete run.</p>")
    parts += [f"<p><i>note: {e(note)}</i></p>" for note in notes]
    parts.append("</body></html>")
    return "\n".join(parts)


def repeat_text(repeats: int, steps: int | None) -> str:
    length = f"{steps} steps each" if steps is not None else "each run to its precision (--precision)"
    return f"{repeats} repeat(s), {length}"


def _write_atomic(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def write_sweep_report(out: Path, results: list[CellResult], *, repeats: int, steps: int | None, command: str,
                       notes: list[str]) -> Path:
    """Writes SWEEP_DIR/report.html and SWEEP_DIR/figures/NAME.png and .pdf; returns the report's path."""
    figures = sweep_figures(results)
    folder = Path(out) / FIGURES_DIR
    folder.mkdir(exist_ok=True)
    for figure in figures:
        _write_atomic(folder / f"{figure.name}.png", figure.png)
        _write_atomic(folder / f"{figure.name}.pdf", figure.pdf)
    page = render_sweep_html(results, figures, repeats=repeats, steps=steps, command=command, notes=notes)
    _write_atomic(Path(out) / REPORT_NAME, page.encode("utf-8"))
    return Path(out) / REPORT_NAME
