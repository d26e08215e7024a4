"""The analysis as Markdown, for issues, pull requests and notes."""

from __future__ import annotations

from stallscope.analysis.analyze import Analysis
from stallscope.pipeline.config import describe_knob
from stallscope.analysis.tfdata import DEVICE_FEED_NOTE
from stallscope.report.text import (STAGE_COLUMNS_NOTE, advice_flags, checked_line, fmt_ms, gain_text, no_fix_line,
                                    run_timing_line, source_lines, spread_cells, spread_rows, verdict_line, xprof_line)


def render_markdown(analysis: Analysis) -> str:
    steps = analysis.steps
    out = [
        f"# Input pipeline analysis: `{analysis.source}`",
        "",
        *(f"    {line}" for line in source_lines(analysis)),
        "",
        f"**{verdict_line(analysis)}**. {xprof_line(analysis)}.",
        "",
        "| per step | mean | p50 | p90 | std |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, spread in spread_rows(steps):
        out.append(f"| {label} | " + " | ".join(spread_cells(spread)) + " |")
    timing = run_timing_line(analysis)
    if timing is not None:
        out += ["", f"{timing}."]
    out += ["", "## tf.data stages", "", "| stage | async | calls | total | busy | work | per call | parallelism |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for st in analysis.tree.stages:
        name = f"**{st.label}** ({analysis.stage_label})" if st.long_name == analysis.tree.bottleneck else st.label
        parallel = "" if st.parallelism is None else describe_knob(st.parallelism)
        out.append(f"| {'&nbsp;' * 2 * st.depth}{name} | {'yes' if st.asynchronous else ''} | {st.calls} | "
                   f"{fmt_ms(st.total_ms)} | {fmt_ms(st.busy_ms)} | {fmt_ms(st.own_ms)} | {st.per_element_us:.0f} us "
                   f"| {parallel} |")
    out += ["", STAGE_COLUMNS_NOTE.strip()]
    if any(st.device_feed for st in analysis.tree.stages):
        out += ["", DEVICE_FEED_NOTE]
    out += ["", "## Checklist", "", "| question | answer | evidence |", "|---|---|---|"]
    out += [f"| {c.question} | {c.answer} | {c.evidence} |" for c in analysis.checklist]
    out += ["", "## Pipeline as written vs as run", ""]
    if analysis.written_chain:
        out.append(f"- written: `{' -> '.join(analysis.written_chain)}`")
    out.append(f"- ran: `{' -> '.join(analysis.ran_chain)}`")
    out += [f"- TF rewrite: {r.describe()}" for r in analysis.rewrites]
    out += ["", "## Fix", ""]
    if not analysis.advice:
        out.append(f"{no_fix_line(analysis).capitalize()}.")
    for number, item in enumerate(analysis.advice, 1):
        flags = advice_flags(analysis, item)
        knobs = f" (`{flags}`)" if flags else ""
        out.append(f"{number}. **{item.title}**{knobs}: {gain_text(item)}; {item.reason}.")
        if item.gain_basis:
            out.append(f"   model: {item.gain_basis}")
        if item.command:
            out.append(f"   `{item.command}`")
        out += ["", "   ```python", *[f"   {line}" for line in item.code.splitlines()], "   ```", ""]
        if item.sizing is not None:
            out += [*service_markdown(item.sizing, indent="   "), ""]
    out += [f"- {checked_line(item)}" for item in analysis.checked]
    out += [f"> note: {n}" for n in analysis.notes]
    return "\n".join(out) + "\n"


def service_markdown(plan, indent: str = "") -> list[str]:
    """The tf.data service what-if (`service_sizing.ServiceSizing`) as a table: a row per worker count."""
    from stallscope.report.text import service_alone, service_heading, service_table

    header, rows = service_table(plan)
    heading = service_heading(plan)
    out = [f"{indent}{heading[0].upper()}{heading[1:]}:", "",
           f"{indent}| " + " | ".join(header) + " |", f"{indent}|---:|---:|---|---:|"]
    out += [f"{indent}| " + " | ".join(row) + " |" for row in rows]
    if (alone := service_alone(plan)) is not None:
        out += ["", f"{indent}{alone[0].upper()}{alone[1:]}."]
    return out


def storage_markdown(figures, what) -> list[str]:
    """The diagnosis' storage section: per-image figures and the what-if as a table."""
    from stallscope.report.text import STORAGE_HEADER, storage_figure_line, storage_rows

    out = ["## Storage", ""]
    if figures is not None:
        out += [storage_figure_line(figures) + ".", ""]
    if what is not None:
        out += ["| " + " | ".join(STORAGE_HEADER) + " |", "|" + "---|" * len(STORAGE_HEADER)]
        out += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in storage_rows(what)]
        out += ["", "Cells: images/s of the pipeline alone, input share of the step, C = requests in flight, "
                "and what limits it."]
        out += [f"> note: {note}" for note in what.notes]
    return out
