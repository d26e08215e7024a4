"""A self-contained HTML report: the Markdown tables' content plus the plots, PNGs embedded as base64."""

from __future__ import annotations

import html

from stallscope.analysis.analyze import Analysis
from stallscope.pipeline.config import describe_knob
from stallscope.report.html_page import STYLE as _STYLE
from stallscope.report.html_page import img_tag as _img
from stallscope.report.html_page import table_html as _table
from stallscope.report.plots import stage_bars_png, step_bars_png
from stallscope.analysis.tfdata import DEVICE_FEED_NOTE
from stallscope.report.text import (STAGE_COLUMNS_NOTE, advice_flags, checked_line, fmt_ms, gain_text, no_fix_line,
                                    run_timing_line, source_lines, spread_cells, spread_rows, verdict_line, xprof_line)


def render_html(analysis: Analysis) -> str:
    e = html.escape
    steps = analysis.steps
    step_rows = [[label, *spread_cells(spread)] for label, spread in spread_rows(steps)]
    marked = "hot" if analysis.input_bound else "slowest"   # red only for a stage that holds the run back
    stage_rows = [[("&nbsp;" * 3 * s.depth) + (f'<span class="{marked}">{e(s.label)}</span>'
                                               if s.long_name == analysis.tree.bottleneck else e(s.label)),
                   "yes" if s.asynchronous else "", str(s.calls), fmt_ms(s.total_ms), fmt_ms(s.busy_ms),
                   fmt_ms(s.own_ms), f"{s.per_element_us:.0f} us",
                   "" if s.parallelism is None else describe_knob(s.parallelism)]
                  for s in analysis.tree.stages]
    timing = run_timing_line(analysis)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>stallscope: {e(analysis.source)}</title>"
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Input pipeline analysis</h1><p><code>{e(analysis.profile_path)}</code></p>",
        "<pre>" + e("\n".join(source_lines(analysis))) + "</pre>",
        f"<p><b>{e(verdict_line(analysis))}</b>. {e(xprof_line(analysis))}.</p>",
        _table(["per step", "mean", "p50", "p90", "std"], step_rows),
        f"<p>{e(timing)}.</p>" if timing else "",
        _img(step_bars_png(analysis), "per-step input wait and compute"),
        "<h2>tf.data stages</h2>",
        _table(["stage", "async", "calls", "total", "busy", "work", "per call", "parallelism"], stage_rows),
        f"<p><small>{e(STAGE_COLUMNS_NOTE.strip())}</small></p>",
        f"<p><small>{e(DEVICE_FEED_NOTE)}</small></p>" if any(s.device_feed for s in analysis.tree.stages) else "",
        _img(stage_bars_png(analysis), "own time per stage"),
        "<h2>Checklist</h2>",
        _table(["question", "answer", "evidence"], [[e(c.question), e(c.answer), e(c.evidence)]
                                                   for c in analysis.checklist]),
        "<h2>Pipeline as written vs as run</h2><ul>",
    ]
    if analysis.written_chain:
        parts.append(f"<li>written: <code>{e(' -> '.join(analysis.written_chain))}</code></li>")
    parts.append(f"<li>ran: <code>{e(' -> '.join(analysis.ran_chain))}</code></li>")
    parts += [f"<li>TF rewrite: {e(r.describe())}</li>" for r in analysis.rewrites]
    parts.append("</ul><h2>Fix</h2>")
    if not analysis.advice:
        parts.append(f"<p>{e(no_fix_line(analysis).capitalize())}.</p>")
    parts.append("<ol>")
    for item in analysis.advice:
        flags = advice_flags(analysis, item)
        knobs = f" <code>{e(flags)}</code>" if flags else ""
        command = f"<pre>$ {e(item.command)}</pre>" if item.command else ""
        basis = f"<br><small>model: {e(item.gain_basis)}</small>" if item.gain_basis else ""
        sized = service_html(item.sizing) if item.sizing is not None else ""
        parts.append(f"<li><b>{e(item.title)}</b>{knobs}: {e(gain_text(item))}; {e(item.reason)}{basis}{command}"
                     f"<pre>{e(item.code)}</pre>{sized}</li>")
    parts.append("</ol>")
    if analysis.checked:
        parts.append("<ul>" + "".join(f"<li>{e(checked_line(item))}</li>" for item in analysis.checked) + "</ul>")
    parts += [f"<p><i>note: {e(n)}</i></p>" for n in analysis.notes]
    parts.append("</body></html>")
    return "\n".join(parts)


def service_html(plan) -> str:
    """The tf.data service what-if (`service_sizing.ServiceSizing`) as a table: a row per worker count."""
    from stallscope.report.text import service_alone, service_heading, service_table

    e = html.escape
    header, rows = service_table(plan)
    alone = service_alone(plan)
    return (f"<p>{e(service_heading(plan))}:</p>" + _table(header, [[e(cell) for cell in row] for row in rows])
            + (f"<p>{e(alone)}</p>" if alone else ""))


def storage_html(figures, what) -> str:
    """The diagnosis' storage section as an HTML fragment (per-image figures and the what-if table)."""
    from stallscope.report.text import STORAGE_HEADER, storage_figure_line, storage_rows

    e = html.escape
    parts = ["<h2>Storage</h2>"]
    if figures is not None:
        parts.append(f"<p>{e(storage_figure_line(figures))}</p>")
    if what is not None:
        parts.append(_table(STORAGE_HEADER, [[e(cell) for cell in row] for row in storage_rows(what)]))
        parts.append("<p>Cells: images/s of the pipeline alone, input share of the step, C = requests in flight, "
                     "and what limits it.</p>")
        parts += [f"<p><i>note: {e(n)}</i></p>" for n in what.notes]
    return "\n".join(parts)
