"""A sweep's figures: per run from its run directory, per cell the median over its repeats, a 95%
interval of their geometric mean and the interval a re-run falls in, each cell's spread pooled with
the sweep's other cells (sweep/interval.py, sweep/pooled_variance.py).

A run's figures come from its steps.csv with the same arithmetic as `stallscope train`'s summary
(`summarize_steps`), leaving out the warm-up steps and the profiled ones (the profiler's own work
would slow them); its slowest tf.data stage from the profile of those last steps (`analyze_run`).

The bottleneck is that stage when the run's measured steps are input-bound. The profile's own
window cannot say so: while the profiler starts, a prefetching pipeline fills its buffer, so the
profiled steps of a run that waits 99% of its time for input found their batches ready, and the
profile's verdict (not input-bound) left the table's bottleneck empty.
"""

from __future__ import annotations

import collections
import json
import logging
import statistics
from pathlib import Path
from typing import Any

from stallscope.errors import StallscopeError
from stallscope.sweep.figures import CellResult, RunFigures
from stallscope.sweep.grid import Cell, Grid
from stallscope.sweep.interval import log_interval, logit_interval
from stallscope.sweep.pooled_variance import VariancePrior, fit_prior, log_variance, logit_variance
from stallscope.sweep.runner import CELLS_DIR, STORAGE_NAME, profile_window, repeat_complete, repeat_dir
from stallscope.verdict import VERDICTS, verdict_for
from stallscope.workload import rundir
from stallscope.workload.accelerator import parse_accelerator
from stallscope.workload.precision import PrecisionTarget, measure_precision
from stallscope.workload.timing import summarize_steps

__all__ = ["CellResult", "RunFigures", "cell_result", "load_grid_dict", "run_figures", "sweep_results", "variance_prior"]

log = logging.getLogger(__name__)
_INPUT_BOUND = VERDICTS[:2]  # 'highly', 'moderately'


def run_figures(run_dir: Path, shared: dict[str, Any], *, out: Path | None = None) -> RunFigures:
    """One complete run's figures, profiled steps left out; its folder named relative to `out`."""
    window = profile_window(shared)
    steps = rundir.read_steps(run_dir)
    kept = [s for s in steps if window is None or not window[0] <= s.step <= window[1]]
    stats = summarize_steps(kept)
    summary = rundir.read_json(run_dir, rundir.SUMMARY_NAME)
    requests, served_bytes, ahead = _served_per_image(run_dir, int(summary["batch_size"]) * int(summary["last_step"]),
                                                      summary.get("source"))
    made = summary.get("store_requests") or {}
    slowest, blamed = _profile_stages(run_dir) if window else (None, None)
    verdict = verdict_for(stats.input_share)
    reader = (summary.get("source") or {}).get("reader")
    precision = _precision(kept, shared, summary)
    return RunFigures(
        repeat=_repeat_number(run_dir), run_dir=str(run_dir.relative_to(out) if out else run_dir),
        images_per_second=stats.images_per_second, step_time_ms=stats.step_time_ms,
        input_wait_ms=stats.input_wait_ms, compute_ms=stats.compute_ms, input_share=stats.input_share,
        verdict=verdict, measured_steps=stats.steps - stats.warmup_steps, batch_size=int(summary["batch_size"]),
        slowest_stage=slowest, bottleneck=(blamed or slowest) if verdict in _INPUT_BOUND else None,
        final_loss=summary.get("final_loss"), client=reader.split(" (", 1)[0] if reader else None,
        requests_per_image=requests, bytes_per_image=served_bytes, images_read_per_trained=ahead,
        request_ms_median=made.get("median_ms"), request_ms_p90=made.get("p90_ms"),
        precision_spread=precision.spread, precision_target=precision.target, precision_reached=precision.reached,
        measured_s=precision.measured_s, stopped_by=precision.stopped_by, precision_warning=precision.warning,
        cold_start=_cold_start(summary.get("cold")))


def _precision(kept: list[rundir.StepRecord], shared: dict[str, Any], summary: dict[str, Any]):
    """The precision of the steps the figures are over, by the workload's own measure. With --precision
    they are the steps the run measured its precision over (profiled ones count as its warm-up), so
    this is the figure the run stopped on; with --steps the profiled last ones are left out here."""
    target = PrecisionTarget(**shared["precision"]) if shared.get("precision") else None
    stopped_by = (summary.get("precision") or {}).get("stopped_by") or "steps"
    return measure_precision(kept, target=target, stopped_by=stopped_by)


def _cold_start(cold: dict[str, Any] | None) -> str | None:
    """'evicted', 'not applicable' (gs://, s3://: cold anyway), 'nothing evicted'; None: not asked."""
    if not cold:
        return None
    if cold.get("applied"):
        return "evicted"
    return "not applicable" if str(cold.get("how", "")).startswith("not applicable") else "nothing evicted"


def _repeat_number(run_dir: Path) -> int:
    number = run_dir.name.rsplit("-", 1)[-1]
    return int(number) if number.isdigit() else 1


def _served_per_image(run_dir: Path, trained: int, source: Any) -> tuple[float | None, float | None, float | None]:
    """What an emulated store served the run: (requests, bytes) per image it *read*, and images read per
    image trained; (None, None, None) on local disk. Images read are the bytes served over the data set's
    bytes per image, so a pipeline that read a whole pass ahead (a shuffle filling its buffer) shows
    1.00 request per file, not 1.95 because the run stopped half-way through training on that pass.
    Per image trained where the data set's size is unknown (None beside it)."""
    try:
        served = json.loads((run_dir / STORAGE_NAME).read_text(encoding="utf-8")).get("served")
    except (OSError, ValueError, AttributeError):
        return None, None, None
    if not isinstance(served, dict) or not trained:
        return None, None, None
    requests, served_bytes = served.get("requests", 0), served.get("bytes", 0)
    size, examples = (source.get("bytes"), source.get("examples")) if isinstance(source, dict) else (None, None)
    if not (isinstance(size, (int, float)) and size > 0 and isinstance(examples, int) and examples > 0 and served_bytes):
        return requests / trained, served_bytes / trained, None
    read = served_bytes / (size / examples)
    return requests / read, served_bytes / read, read / trained


def _profile_stages(run_dir: Path) -> tuple[str | None, str | None]:
    """(the tf.data stage the walk of the run's profile stops at, what `analyze` blames where the run is
    input-bound: "fetch" for a wait on a remote store's latency, else that stage); Nones where the
    profile names none. The seed's cells on a bucket all said BatchV2, the stage a filled shuffle
    buffer's window stops at, while their runs waited on reads."""
    from stallscope.analysis.analyze import analyze_run

    if not rundir.profile_files(run_dir):
        return None, None
    try:
        analysis = analyze_run(run_dir, with_xprof=False)
    except StallscopeError as exc:
        log.warning("%s: no bottleneck from its profile (%s)", run_dir, exc)
        return None, None
    return analysis.slowest_stage, analysis.bottleneck


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _complete_figures(out: Path, grid: Grid, cell: Cell) -> list[RunFigures]:
    folder = Path(out) / CELLS_DIR / cell.name
    runs = [repeat_dir(folder, r) for r in range(1, grid.repeats + 1)]
    return [run_figures(r, grid.shared, out=Path(out)) for r in runs if repeat_complete(r, grid.shared["steps"])]


def variance_prior(figures_by_cell: list[list[RunFigures]]) -> VariancePrior | None:
    """What the sweep's cells say of a cell's run-to-run spread (sweep/pooled_variance.py)."""
    return fit_prior([log_variance([f.images_per_second for f in figures]) for figures in figures_by_cell])


def share_prior(figures_by_cell: list[list[RunFigures]]) -> VariancePrior | None:
    """The same of a cell's input share, on the logit scale."""
    return fit_prior([logit_variance([f.input_share for f in figures]) for figures in figures_by_cell])


def cell_result(out: Path, grid: Grid, cell: Cell, *, prior: VariancePrior | None = None,
                figures: list[RunFigures] | None = None, shares: VariancePrior | None = None) -> CellResult:
    """A cell's summary over its complete runs; its images/s intervals pooled with `prior`, its input
    share's with `shares` (None: its own)."""
    if figures is None:
        figures = _complete_figures(out, grid, cell)
    ips = [f.images_per_second for f in figures]
    share = _median([f.input_share for f in figures])
    compute = _median([f.compute_ms for f in figures])
    blamed = collections.Counter(f.bottleneck for f in figures if f.bottleneck)
    clients = collections.Counter(f.client for f in figures if f.client)
    batch = figures[0].batch_size if figures else None
    return CellResult(
        cell=cell, repeats_asked=grid.repeats, runs=tuple(figures), images_per_second=_median(ips),
        images_per_second_interval=log_interval(ips, prior=prior),
        images_per_second_rerun=log_interval(ips, prior=prior, rerun_repeats=grid.repeats),
        step_time_ms=_median([f.step_time_ms for f in figures]), input_wait_ms=_median([f.input_wait_ms for f in figures]),
        compute_ms=compute, input_share=share, input_share_interval=logit_interval([f.input_share for f in figures], prior=shares),
        verdict=None if share is None else verdict_for(share),
        bottleneck=blamed.most_common(1)[0][0] if blamed else None,
        device_images_per_second=_device_speed(cell.accelerator, batch, compute),
        final_loss=_median([f.final_loss for f in figures]),
        client=clients.most_common(1)[0][0] if clients else None,
        requests_per_image=_median([f.requests_per_image for f in figures]),
        bytes_per_image=_median([f.bytes_per_image for f in figures]),
        images_read_per_trained=_median([f.images_read_per_trained for f in figures]),
        request_ms_median=_median([f.request_ms_median for f in figures]),
        request_ms_p90=_median([f.request_ms_p90 for f in figures]),
        variance_prior=prior,
    )


def _device_speed(accelerator: str, batch: int | None, compute_ms: float | None) -> float | None:
    """Images/s of the device alone: an emulated device's set speed (its waits jitter by a few %),
    a real one's measured batch / median compute time."""
    spec = parse_accelerator(accelerator)
    if spec.images_per_second:
        return float(spec.images_per_second)
    if not batch:
        return None
    step_ms = spec.ms_per_step or compute_ms
    return batch * 1000.0 / step_ms if step_ms else None


def sweep_results(out: Path, grid: Grid) -> list[CellResult]:
    """Every cell's summary, each cell's spread pooled with the others'."""
    cells = grid.cells()
    figures = [_complete_figures(out, grid, cell) for cell in cells]
    prior, shares = variance_prior(figures), share_prior(figures)
    return [cell_result(out, grid, cell, prior=prior, figures=f, shares=shares) for cell, f in zip(cells, figures)]


def load_grid_dict(out: Path) -> dict[str, Any] | None:
    from stallscope.sweep.runner import GRID_NAME

    path = Path(out) / GRID_NAME
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
