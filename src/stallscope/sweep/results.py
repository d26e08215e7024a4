"""A sweep's figures: per run from its run directory, per cell the median over its repeats.

A run's figures come from its steps.csv with the same arithmetic as `stallscope train`'s summary
(`summarize_steps`), leaving out the warm-up steps and the profiled ones (the profiler's own work
would slow them); its bottleneck from the profile of those last steps (`analyze_run`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import statistics
from pathlib import Path
from typing import Any

from stallscope.errors import StallscopeError
from stallscope.sweep.grid import Cell, Grid
from stallscope.sweep.runner import CELLS_DIR, profile_window, repeat_complete, repeat_dir
from stallscope.verdict import verdict_for
from stallscope.workload import rundir
from stallscope.workload.accelerator import parse_accelerator
from stallscope.workload.timing import summarize_steps

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunFigures:
    images_per_second: float
    step_time_ms: float
    input_wait_ms: float
    compute_ms: float
    input_share: float
    measured_steps: int
    batch_size: int
    bottleneck: str | None
    final_loss: float | None
    requests_per_image: float | None     # an emulated store's requests over the whole run / images trained
    bytes_per_image: float | None        # the same for the bytes it served (listings and read-ahead included)
    request_ms_median: float | None = None  # a request's time from asking to its last byte, as stallscope's
    request_ms_p90: float | None = None     # reader saw it (None where TF's gs:// client read)


@dataclasses.dataclass(frozen=True)
class CellResult:
    """A cell's medians over its complete repeats (numbers stay numbers; rendering is elsewhere)."""

    cell: Cell
    repeats: int                         # complete repeats the medians are over
    repeats_asked: int
    images_per_second: float | None
    step_time_ms: float | None
    input_wait_ms: float | None
    compute_ms: float | None
    input_share: float | None
    verdict: str | None
    bottleneck: str | None               # the stage most repeats' profiles blame
    spread: float | None                 # (max - min) / median of images/s over repeats; None with one
    images_per_second_min: float | None
    images_per_second_max: float | None
    device_images_per_second: float | None  # the accelerator's own speed: an emulated one's, or batch / compute
    final_loss: float | None
    requests_per_image: float | None     # emulated stores only: median over repeats
    bytes_per_image: float | None
    run_dirs: tuple[str, ...]
    request_ms_median: float | None = None  # stallscope's reader: medians over repeats of each run's own
    request_ms_p90: float | None = None

    @property
    def complete(self) -> bool:
        return self.repeats == self.repeats_asked

    def row(self) -> dict[str, Any]:
        """A flat, JSON-ready row for the CSV and the HParams metrics."""
        values = {"cell": self.cell.name, **self.cell.to_dict()}
        values.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                       if f.name not in ("cell", "run_dirs")})
        values["complete"] = self.complete
        values["run_dirs"] = " ".join(self.run_dirs)
        return values


def run_figures(run_dir: Path, shared: dict[str, Any]) -> RunFigures:
    """One complete run's figures, profiled steps left out."""
    window = profile_window(shared)
    steps = rundir.read_steps(run_dir)
    kept = [s for s in steps if window is None or not window[0] <= s.step <= window[1]]
    stats = summarize_steps(kept)
    summary = rundir.read_json(run_dir, rundir.SUMMARY_NAME)
    requests, served_bytes = _served_per_image(run_dir, int(summary["batch_size"]) * int(summary["last_step"]))
    made = summary.get("store_requests") or {}
    return RunFigures(images_per_second=stats.images_per_second, step_time_ms=stats.step_time_ms,
                      input_wait_ms=stats.input_wait_ms, compute_ms=stats.compute_ms, input_share=stats.input_share,
                      measured_steps=stats.steps - stats.warmup_steps, batch_size=int(summary["batch_size"]),
                      bottleneck=_bottleneck(run_dir) if window else None, final_loss=summary.get("final_loss"),
                      requests_per_image=requests, bytes_per_image=served_bytes,
                      request_ms_median=made.get("median_ms"), request_ms_p90=made.get("p90_ms"))


def _served_per_image(run_dir: Path, images: int) -> tuple[float | None, float | None]:
    """What an emulated store served the run, per image it trained on; (None, None) on local disk."""
    from stallscope.sweep.runner import STORAGE_NAME

    try:
        served = json.loads((run_dir / STORAGE_NAME).read_text(encoding="utf-8")).get("served")
    except (OSError, ValueError, AttributeError):
        return None, None
    if not isinstance(served, dict) or not images:
        return None, None
    return served.get("requests", 0) / images, served.get("bytes", 0) / images


def _bottleneck(run_dir: Path) -> str | None:
    """The tf.data stage the run's profile blames, or None when the profile names none."""
    from stallscope.analysis.analyze import analyze_run

    if not rundir.profile_files(run_dir):
        return None
    try:
        return analyze_run(run_dir, with_xprof=False).bottleneck
    except StallscopeError as exc:
        log.warning("%s: no bottleneck from its profile (%s)", run_dir, exc)
        return None


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def cell_result(out: Path, grid: Grid, cell: Cell) -> CellResult:
    folder = Path(out) / CELLS_DIR / cell.name
    runs = [repeat_dir(folder, r) for r in range(1, grid.repeats + 1)]
    complete = [r for r in runs if repeat_complete(r, grid.shared["steps"])]
    figures = [run_figures(r, grid.shared) for r in complete]
    ips = [f.images_per_second for f in figures]
    median_ips = _median(ips)
    share = _median([f.input_share for f in figures])
    compute = _median([f.compute_ms for f in figures])
    blamed = collections.Counter(f.bottleneck for f in figures if f.bottleneck)
    batch = figures[0].batch_size if figures else None
    return CellResult(
        cell=cell, repeats=len(figures), repeats_asked=grid.repeats, images_per_second=median_ips,
        step_time_ms=_median([f.step_time_ms for f in figures]), input_wait_ms=_median([f.input_wait_ms for f in figures]),
        compute_ms=compute, input_share=share, verdict=None if share is None else verdict_for(share),
        bottleneck=blamed.most_common(1)[0][0] if blamed else None,
        spread=(max(ips) - min(ips)) / median_ips if len(ips) > 1 and median_ips else None,
        images_per_second_min=min(ips) if ips else None, images_per_second_max=max(ips) if ips else None,
        device_images_per_second=_device_speed(cell.accelerator, batch, compute),
        final_loss=_median([f.final_loss for f in figures]),
        requests_per_image=_median([f.requests_per_image for f in figures]),
        bytes_per_image=_median([f.bytes_per_image for f in figures]),
        run_dirs=tuple(str(r.relative_to(out)) for r in complete),
        request_ms_median=_median([f.request_ms_median for f in figures]),
        request_ms_p90=_median([f.request_ms_p90 for f in figures]),
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
    return [cell_result(out, grid, cell) for cell in grid.cells()]


def load_grid_dict(out: Path) -> dict[str, Any] | None:
    from stallscope.sweep.runner import GRID_NAME

    path = Path(out) / GRID_NAME
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
