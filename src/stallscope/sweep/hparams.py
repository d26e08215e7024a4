"""The sweep as TensorBoard HParams: `tensorboard --logdir SWEEP_DIR/hparams`, HParams tab.

One experiment summary (the axes and metrics) at the root, and one session per cell (its axis
values, then its medians as scalars at step 0; input share in %, as in the tables), written with TensorBoard's own protos and event
writer, so TensorFlow is not needed and the folder is rewritten whole at the end of each sweep.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from stallscope.sweep.figures import STORE_LABELS, CellResult, bandwidth_name
from stallscope.sweep.grid import Grid

HPARAMS_DIR = "hparams"

# (metric tag, TensorBoard display name, its value from a CellResult)
METRICS = (
    ("images_per_second", "images/s (median)", lambda r: r.images_per_second),
    ("images_per_second_ci95_half_width", "images/s 95% t-interval half-width",
     lambda r: r.images_per_second_interval and r.images_per_second_interval.half_width),
    ("step_time_ms", "step time ms (median)", lambda r: r.step_time_ms),
    ("input_wait_ms", "input wait ms (median)", lambda r: r.input_wait_ms),
    ("input_share_pct", "input share % (median)", lambda r: None if r.input_share is None else r.input_share * 100),
    ("final_loss", "final loss (median)", lambda r: r.final_loss),
    ("requests_per_image", "storage requests per image (emulated stores)", lambda r: r.requests_per_image),
)


def _scalar_event(tag: str, value: float, wall_time: float):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.scalar import metadata as scalar_metadata
    from tensorboard.util import tensor_util

    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag=tag, tensor=tensor_util.make_tensor_proto(float(value)),
        metadata=scalar_metadata.create_summary_metadata(display_name=tag, description=""))])
    return event_pb2.Event(wall_time=wall_time, step=0, summary=summary)


def _summary_event(summary, wall_time: float):
    from tensorboard.compat.proto import event_pb2

    return event_pb2.Event(wall_time=wall_time, step=0, summary=summary)


def write_hparams(out: Path, grid: Grid, results: list[CellResult]) -> Path:
    """Writes SWEEP_DIR/hparams (replacing the one an earlier pass wrote) and returns its path."""
    from tensorboard.plugins.hparams import api as hp
    from tensorboard.plugins.hparams import summary_v2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    axes = grid.axes
    params = {
        "format": hp.HParam("format", hp.Discrete(list(axes.formats))),
        "store": hp.HParam("store", hp.Discrete([STORE_LABELS[s] for s in axes.stores])),
        "latency": hp.HParam("latency", hp.Discrete(sorted({c.latency for c in grid.cells()}))),
        "bandwidth": hp.HParam("bandwidth", hp.Discrete(sorted({bandwidth_name(c.bandwidth_bps)
                                                                for c in grid.cells()}))),
        "pipeline": hp.HParam("pipeline", hp.Discrete(list(axes.pipelines))),
        "accelerator": hp.HParam("accelerator", hp.Discrete(list(axes.accelerators))),
        "learning_rate": hp.HParam("learning_rate", hp.Discrete([float(v) for v in axes.learning_rates])),
    }
    added_ms = sorted({c.latency_ms for c in grid.cells() if c.latency_ms is not None})
    if added_ms:  # the latency as a number, to plot against (local disk cells have none: nothing added)
        params["latency_ms"] = hp.HParam("latency_ms", hp.RealInterval(added_ms[0], added_ms[-1]))
    if grid.shared.get("cold"):  # only then: a warm sweep's HParams read as before
        params["start"] = hp.HParam("start", hp.Discrete(["cold"]))
    metrics = [hp.Metric(name, display_name=shown) for name, shown, _ in METRICS]
    target = Path(out) / HPARAMS_DIR
    staging = target.with_name(HPARAMS_DIR + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    now = time.time()
    root = EventFileWriter(str(staging))
    root.add_event(_summary_event(summary_v2.hparams_config_pb(list(params.values()), metrics, time_created_secs=now),
                                  now))
    root.close()
    for result in results:
        if not result.repeats:
            continue  # a cell with no complete run has no figures to compare
        cell = result.cell
        writer = EventFileWriter(str(staging / cell.name))
        values = {params["format"]: cell.format, params["store"]: STORE_LABELS[cell.store],
                  params["latency"]: cell.latency, params["bandwidth"]: bandwidth_name(cell.bandwidth_bps),
                  params["pipeline"]: cell.pipeline,
                  params["accelerator"]: cell.accelerator, params["learning_rate"]: float(cell.learning_rate)}
        if "latency_ms" in params and cell.latency_ms is not None:
            values[params["latency_ms"]] = cell.latency_ms
        if "start" in params:
            values[params["start"]] = "cold"
        writer.add_event(_summary_event(summary_v2.hparams_pb(values, trial_id=cell.name, start_time_secs=now), now))
        for name, _, measure in METRICS:
            value = measure(result)
            if value is not None:
                writer.add_event(_scalar_event(name, value, now))
        writer.close()
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target
