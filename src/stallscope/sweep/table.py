"""The sweep's tables: results.csv (tidy, one row per run), summary.csv (one row per cell: medians, the
95% interval of the geometric mean of its repeats and the 95% interval a re-run of it falls in) and
results.md (the summary, rendered).

Column names carry their units (`images_per_second`, `input_share_pct`, `latency_ms`); input share is
a percentage in every table. Numbers stay numbers in the CSVs; an empty field is a figure not measured
(a local cell's latency, TF's clients' request times).

Each run's precision is the workload's own (workload/precision.py): how far apart the images/s of its
measured time's two halves are (`precision_spread_pct`), whether that is within the --precision asked
for (`precision_reached`; 10% without one) and over how long (`measured_s`). A cold cell's runs say what
--cold did (`cold_start`): evicted, or not applicable on gs:// and s3://.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from stallscope.sweep.figures import LOCAL, CellResult, Cell, RunFigures
from stallscope.sweep.interval import BOTH_METHODS, NO_INTERVAL, RERUN_METHOD, Interval

CSV_NAME = "results.csv"
SUMMARY_NAME = "summary.csv"
MARKDOWN_NAME = "results.md"

CELL_FIELDS = ("cell", "format", "store", "client", "latency_ms", "bandwidth_mbit_per_s", "pipeline", "accelerator",
               "learning_rate", "cold")
RUN_FIELDS = CELL_FIELDS + (
    "repeat", "images_per_second", "step_time_ms", "input_wait_ms", "compute_ms", "input_share_pct", "verdict",
    "bottleneck", "slowest_stage", "measured_steps", "batch_size", "final_loss", "requests_per_image",
    "bytes_per_image", "images_read_per_trained", "request_ms_median", "request_ms_p90", "precision_spread_pct", "precision_target_pct",
    "precision_reached", "measured_s", "stopped_by", "cold_start", "run_dir")
SUMMARY_FIELDS = CELL_FIELDS + (
    "repeats", "repeats_asked", "complete", "images_per_second_median", "images_per_second_mean",
    "images_per_second_geometric_mean", "images_per_second_ci95_low", "images_per_second_ci95_high",
    "images_per_second_rerun95_low", "images_per_second_rerun95_high", "input_share_pct_median", "input_share_pct_ci95_low",
    "input_share_pct_ci95_high", "interval_method", "step_time_ms_median", "input_wait_ms_median",
    "compute_ms_median", "verdict", "bottleneck", "device_images_per_second", "final_loss_median",
    "requests_per_image_median", "bytes_per_image_median", "images_read_per_trained_median", "request_ms_median",
    "request_ms_p90", "precision_spread_pct_max", "precision_reached_runs", "cold_start", "run_dirs")

MARKDOWN_HEADER = ("format", "store", "latency", "pipeline", "accelerator", "lr", "images/s", "95% interval",
                   "re-run 95%", "step ms", "input share", "verdict", "bottleneck", "requests/image read", "request ms", "precision",
                   "repeats")


def _pct(share: float | None) -> float | None:
    return None if share is None else share * 100.0


def cell_columns(cell: Cell, client: str | None) -> dict[str, Any]:
    return {"cell": cell.name, "format": cell.format, "store": cell.store, "client": client,
            "latency_ms": cell.latency_ms,
            "bandwidth_mbit_per_s": None if cell.bandwidth_bps is None else cell.bandwidth_bps / 1e6,
            "pipeline": cell.pipeline, "accelerator": cell.accelerator, "learning_rate": cell.learning_rate,
            "cold": cell.cold}


def run_row(cell: Cell, run: RunFigures) -> dict[str, Any]:
    """One run as a tidy row (numbers as numbers; input share in %)."""
    row = cell_columns(cell, run.client)
    row.update({name: getattr(run, name) for name in RUN_FIELDS if name not in row and not name.endswith("_pct")})
    row.update(input_share_pct=_pct(run.input_share), precision_spread_pct=_pct(run.precision_spread),
               precision_target_pct=_pct(run.precision_target))
    return row


def worst_spread(result: CellResult) -> float | None:
    """The widest precision spread among a cell's runs (None where none could be measured)."""
    spreads = [run.precision_spread for run in result.runs if run.precision_spread is not None]
    return max(spreads) if spreads else None


def cold_start(result: CellResult) -> str | None:
    """What --cold did to a cell's runs ('evicted', 'not applicable', ...); None for a warm cell."""
    done = sorted({run.cold_start for run in result.runs if run.cold_start})
    return ", ".join(done) if done else ("cold" if result.cell.cold else None)


def precision_text(result: CellResult) -> str:
    """'3.1%' (the worst run's spread), with how many runs missed their target: '12.0% (1/3 not within 5%)'."""
    worst = worst_spread(result)
    if worst is None:
        return "-"
    missed = [run for run in result.runs if not run.precision_reached]
    if not missed:
        return f"{worst:.1%}"
    target = result.runs[0].precision_target
    within = f"{target:.0%}" if target is not None else "10%"
    return f"{worst:.1%} ({len(missed)}/{len(result.runs)} not within {within})"


def interval_method(result: CellResult) -> str:
    if result.images_per_second_interval is not None:
        return BOTH_METHODS
    return NO_INTERVAL if result.repeats == 1 else "no interval (no complete repeat)"


def summary_row(result: CellResult) -> dict[str, Any]:
    """One cell: medians, the means, the 95% interval of the geometric mean and of a re-run's (empty with
    one repeat, as interval_method says)."""
    ips, share, rerun = result.images_per_second_interval, result.input_share_interval, result.images_per_second_rerun
    rates = [run.images_per_second for run in result.runs]
    row = cell_columns(result.cell, result.client)
    row.update({
        "repeats": result.repeats, "repeats_asked": result.repeats_asked, "complete": result.complete,
        "images_per_second_median": result.images_per_second,
        "images_per_second_mean": sum(rates) / len(rates) if rates else None,
        "images_per_second_geometric_mean": ips and ips.mean,
        "images_per_second_ci95_low": ips and ips.low, "images_per_second_ci95_high": ips and ips.high,
        "images_per_second_rerun95_low": rerun and rerun.low, "images_per_second_rerun95_high": rerun and rerun.high,
        "input_share_pct_median": _pct(result.input_share), "input_share_pct_ci95_low": share and _pct(share.low),
        "input_share_pct_ci95_high": share and _pct(share.high), "interval_method": interval_method(result),
        "step_time_ms_median": result.step_time_ms, "input_wait_ms_median": result.input_wait_ms,
        "compute_ms_median": result.compute_ms, "verdict": result.verdict, "bottleneck": result.bottleneck,
        "device_images_per_second": result.device_images_per_second, "final_loss_median": result.final_loss,
        "requests_per_image_median": result.requests_per_image, "bytes_per_image_median": result.bytes_per_image,
        "images_read_per_trained_median": result.images_read_per_trained,
        "request_ms_median": result.request_ms_median, "request_ms_p90": result.request_ms_p90,
        "precision_spread_pct_max": _pct(worst_spread(result)),
        "precision_reached_runs": sum(1 for run in result.runs if run.precision_reached),
        "cold_start": cold_start(result), "run_dirs": " ".join(result.run_dirs)})
    return row


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _significant(value: float | None) -> str:
    """1.00, 2.00, 0.00938: three figures, so a record shard's share of a request is not shown as 0.01."""
    return "-" if value is None else f"{value:#.3g}".rstrip(".")


def interval_text(interval: Interval | None, repeats: int) -> str:
    """'398 to 430' (tenths below 100: '9.6 to 10.4') or why there is none."""
    if interval is None:
        return "no interval" if repeats == 1 else "-"
    digits = 0 if interval.low >= 100 else 1
    return f"{interval.low:,.{digits}f} to {interval.high:,.{digits}f}"


def markdown_cells(result: CellResult) -> list[str]:
    """A row's cells as the Markdown table and the HTML report show them."""
    cell = result.cell
    latency = "-" if cell.store == LOCAL else cell.latency
    share = "-" if result.input_share is None else f"{result.input_share * 100:.1f}%"
    store = cell.where.split(" ")[0] if cell.store != LOCAL else "local disk"
    if cell.cold:
        store += f" (cold: {cold_start(result)})" if cold_start(result) != "cold" else " (cold)"
    return [cell.format, store, latency, cell.pipeline,
            cell.accelerator, f"{cell.learning_rate:g}", _num(result.images_per_second),
            interval_text(result.images_per_second_interval, result.repeats),
            interval_text(result.images_per_second_rerun, result.repeats), _num(result.step_time_ms), share,
            result.verdict or "-", result.bottleneck or "-", _significant(result.requests_per_image),
            _num(result.request_ms_median), precision_text(result), f"{result.repeats}/{result.repeats_asked}"]


def write_rows(path: Path, fields: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({name: "" if row[name] is None else row[name] for name in fields})
    os.replace(temporary, path)


def write_csv(path: Path, results: list[CellResult]) -> None:
    """results.csv: one row per complete run."""
    write_rows(path, RUN_FIELDS, [run_row(r.cell, run) for r in results for run in r.runs])


def write_summary_csv(path: Path, results: list[CellResult]) -> None:
    """summary.csv: one row per cell, a cell without a complete run included (its figures empty)."""
    write_rows(path, SUMMARY_FIELDS, [summary_row(r) for r in results])


def markdown_table(results: list[CellResult]) -> list[str]:
    lines = ["| " + " | ".join(MARKDOWN_HEADER) + " |", "|" + "---|" * len(MARKDOWN_HEADER)]
    lines += ["| " + " | ".join(markdown_cells(r)) + " |" for r in results]
    return lines


TABLE_NOTE = (f"images/s: the median over each cell's repeats; intervals: {BOTH_METHODS} (none with one repeat); "
              f"95% interval: of the geometric mean of images/s; re-run 95%: {RERUN_METHOD}; input share: input wait "
              "as a percentage of step time (its interval in summary.csv); requests/image read: an emulated store's "
              "requests over the images it served (its bytes over the data set's bytes per image), steady however far "
              "reads ran ahead of training (images_read_per_trained in the CSVs says how far); request ms: a request's "
              "median time from asking to its last byte, as stallscope's own readers saw it (- where TF's clients "
              "read); precision: the widest apart any run's two halves' images/s are.")


def pooling_note(results: list[CellResult]) -> str | None:
    """How the cells' spreads were pooled, in words: what the intervals lean on beside each cell's runs."""
    prior = next((r.variance_prior for r in results if r.variance_prior is not None), None)
    if prior is None:
        return None
    worth = ("every cell's spread is alike up to chance: each interval uses the pooled one" if prior.df == float("inf")
             else f"the pooled spread weighs as {prior.df:.1f} degrees of freedom beside each cell's own, its repeats less one")
    return (f"intervals of images/s: each cell's run-to-run spread pooled with the {prior.cells} cells of this sweep "
            f"(a typical run differs from its cell's geometric mean by {prior.typical_spread:.1%}; {worth})")


def write_markdown(path: Path, results: list[CellResult], *, title: str, notes: list[str]) -> None:
    body = [f"# {title}", "", TABLE_NOTE, ""]
    body += markdown_table(results) + [""] + [f"- {note}" for note in notes]
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text("\n".join(body).rstrip() + "\n", encoding="utf-8")
    os.replace(temporary, path)
