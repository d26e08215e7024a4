"""A sweep's cells and figures as plain data: what the tables, HParams and the report are given.

Nothing here reads a run or imports the workload: sweep/results.py measures runs into these
dataclasses, and report/ renders them without reaching the code that ran them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from stallscope.sweep.interval import Interval
from stallscope.sweep.pooled_variance import VariancePrior

LOCAL = "local"           # the store that is the folder on local disk (and its latency: none added)
EMULATED_STORES = ("gcs", "s3", "mount")
STORES = (LOCAL, *EMULATED_STORES)
STORE_LABELS = {LOCAL: "local disk", "gcs": "gs://", "s3": "s3://", "mount": "FUSE mount"}


def bandwidth_name(bandwidth_bps: float | None) -> str:
    """'200Mbit' for a cap, 'uncapped' for none."""
    return "uncapped" if bandwidth_bps is None else f"{bandwidth_bps / 1e6:g}Mbit"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One combination of the axes: one `stallscope train` configuration, run `repeats` times. A cell on
    local disk has latency 'local' and no bandwidth cap; an emulated store's has its per-request latency.
    `cold`: each run starts with the data evicted from the page cache (`train --cold`); a cell of its own,
    so a resumed sweep never mixes cold runs with warm ones."""

    format: str
    store: str
    latency: str
    pipeline: str
    accelerator: str
    learning_rate: float
    bandwidth_bps: float | None = None
    cold: bool = False

    @property
    def name(self) -> str:
        """A folder name that reads as the cell: files-local-seed-emulated_500-lr0.0001,
        records-gcs-10ms-200Mbit-tuned-real-lr0.0001, files-local-seed-real-lr0.0001-cold."""
        where = LOCAL if self.store == LOCAL else f"{self.store}-{self.latency}"
        if self.bandwidth_bps is not None:
            where += f"-{bandwidth_name(self.bandwidth_bps)}"
        text = f"{self.format}-{where}-{self.pipeline}-{self.accelerator}-lr{self.learning_rate:g}"
        if self.cold:
            text += "-cold"
        return re.sub(r"[^A-Za-z0-9.+-]", "_", text)

    @property
    def latency_ms(self) -> float | None:
        """The emulated store's added latency per request in ms; None on local disk (nothing added)."""
        return None if self.store == LOCAL else float(self.latency.removesuffix("ms"))

    @property
    def where(self) -> str:
        """'gs:// 10ms', 's3:// 0ms 200Mbit', 'local disk': the store as a legend names it."""
        if self.store == LOCAL:
            return STORE_LABELS[LOCAL]
        cap = "" if self.bandwidth_bps is None else f" {bandwidth_name(self.bandwidth_bps)}"
        return f"{STORE_LABELS[self.store]} {self.latency}{cap}"

    def to_dict(self) -> dict[str, Any]:
        """Without `cold` when warm: a warm cell's settings read as before cold cells existed, so the
        sweeps written then resume."""
        data = dataclasses.asdict(self)
        if not self.cold:
            del data["cold"]
        return data


@dataclasses.dataclass(frozen=True)
class RunFigures:
    """One run's figures over its measured steps (warm-up and profiled steps left out)."""

    repeat: int
    run_dir: str                         # relative to the sweep folder
    images_per_second: float
    step_time_ms: float
    input_wait_ms: float
    compute_ms: float
    input_share: float                   # 0..1 here; the tables show it as a percentage
    verdict: str
    measured_steps: int
    batch_size: int
    slowest_stage: str | None            # where the profile's walk stops
    bottleneck: str | None               # that stage, when the run's measured steps are input-bound
    final_loss: float | None
    client: str | None                   # who read the data: 'TF gs://', "stallscope's s3:// reader", ...
    requests_per_image: float | None     # an emulated store's requests / images it served (its bytes over the
                                         # data set's bytes per image): steady, however far reads ran ahead
    bytes_per_image: float | None        # the same for the bytes it served (listings included)
    request_ms_median: float | None = None  # a request's time from asking to its last byte, as stallscope's
    request_ms_p90: float | None = None     # reader saw it (None where TF's own clients read)
    precision_spread: float | None = None   # its measured steps' two halves' images/s apart, 0..1
                                            # (workload/precision.py); None: too few steps to compare
    precision_target: float | None = None   # the --precision asked for; None: a fixed --steps
    precision_reached: bool = False         # within the target (10% without one)
    measured_s: float | None = None         # time of the steps its figures are over
    stopped_by: str | None = None           # 'precision', 'max_seconds', 'steps', ...
    precision_warning: str | None = None    # why its figure is not to be trusted; None where it is
    cold_start: str | None = None           # with --cold: 'evicted' or 'not applicable' (gs://, s3://)
    images_read_per_trained: float | None = None  # images the store served / images trained: how far reads ran
                                                  # ahead of training (1.95: a pass read for half a pass trained)


@dataclasses.dataclass(frozen=True)
class CellResult:
    """A cell's runs and their summary: medians over the complete repeats; where there are two or more,
    the 95% interval of their geometric mean and the one a re-run's falls in (`images_per_second_rerun`),
    both with the cell's spread pooled with the sweep's (`variance_prior`; None: its own)."""

    cell: Cell
    repeats_asked: int
    runs: tuple[RunFigures, ...]         # complete repeats only
    images_per_second: float | None      # median
    images_per_second_interval: Interval | None
    step_time_ms: float | None
    input_wait_ms: float | None
    compute_ms: float | None
    input_share: float | None            # median, 0..1
    input_share_interval: Interval | None
    verdict: str | None
    bottleneck: str | None               # the stage most input-bound repeats' profiles blame
    device_images_per_second: float | None  # the accelerator's own speed: an emulated one's, or batch / compute
    final_loss: float | None
    client: str | None
    requests_per_image: float | None     # emulated stores only: per image read, median over repeats
    bytes_per_image: float | None
    request_ms_median: float | None = None  # stallscope's reader: medians over repeats of each run's own
    request_ms_p90: float | None = None
    images_per_second_rerun: Interval | None = None
    variance_prior: VariancePrior | None = None
    images_read_per_trained: float | None = None  # median over repeats (RunFigures')

    @property
    def repeats(self) -> int:
        """Complete repeats the medians are over."""
        return len(self.runs)

    @property
    def complete(self) -> bool:
        return self.repeats == self.repeats_asked

    @property
    def run_dirs(self) -> tuple[str, ...]:
        return tuple(run.run_dir for run in self.runs)
