"""The sweep as TensorBoard HParams: `tensorboard --logdir SWEEP_DIR/hparams`, HParams tab.

One experiment summary (the axes and metrics) at the root, and one session per cell (its axis
values, then its medians as scalars at step 0), written with TensorBoard's own protos and event
writer, so TensorFlow is not needed and the folder is rewritten whole at the end of each sweep.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from stallscope.sweep.grid import Grid
from stallscope.sweep.results import CellResult

HPARAMS_DIR = "hparams"

# (field of CellResult, TensorBoard display name)
METRICS = (
    ("images_per_second", "images/s (median)"),
    ("step_time_ms", "step time ms (median)"),
    ("input_wait_ms", "input wait ms (median)"),
    ("input_share", "input share (median, 0..1)"),
    ("spread", "images/s spread over repeats"),
    ("final_loss", "final loss (median)"),
    ("requests_per_image", "storage requests per image (emulated stores)"),
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
        "latency": hp.HParam("latency", hp.Discrete(list(axes.latencies))),
        "pipeline": hp.HParam("pipeline", hp.Discrete(list(axes.pipelines))),
        "accelerator": hp.HParam("accelerator", hp.Discrete(list(axes.accelerators))),
        "learning_rate": hp.HParam("learning_rate", hp.Discrete([float(v) for v in axes.learning_rates])),
    }
    metrics = [hp.Metric(name, display_name=shown) for name, shown in METRICS]
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
        values = {params["format"]: cell.format, params["latency"]: cell.latency, params["pipeline"]: cell.pipeline,
                  params["accelerator"]: cell.accelerator, params["learning_rate"]: float(cell.learning_rate)}
        writer.add_event(_summary_event(summary_v2.hparams_pb(values, trial_id=cell.name, start_time_secs=now), now))
        for name, _ in METRICS:
            value = getattr(result, name)
            if value is not None:
                writer.add_event(_scalar_event(name, value, now))
        writer.close()
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target
