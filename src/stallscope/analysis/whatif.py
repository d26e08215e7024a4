"""What-if figures from measured ones: pure arithmetic, no TensorFlow.

The model is the one every input-stall study uses: a step takes the device's compute time and the
pipeline's time to produce one batch. With a prefetch buffer the two overlap (the step lasts as long
as the slower one); without one the pipeline runs inside `get_next` and they add up. Input wait is
the step time beyond compute; input share is wait / step, classed with XProf's thresholds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from stallscope.errors import UsageError
from stallscope.verdict import HIGHLY_INPUT_BOUND, verdict_for

# Device speeds (images/s) a what-if table is shown against: a laptop GPU to a large accelerator.
DEFAULT_DEVICE_SPEEDS = (250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0)
DEFAULT_EXTRA_CORES = (0, 1, 2, 4, 8)


def _require_non_negative(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
        raise UsageError(f"{name}: expected a finite number >= 0, got {value!r}")


def _require_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise UsageError(f"{name}: expected a finite number > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Steady-state figures of one step under the overlap model."""

    compute_ms: float
    pipeline_ms: float
    step_ms: float
    input_wait_ms: float
    input_share: float
    images_per_second: float
    verdict: str
    # The part of pipeline_ms no prefetch hides (`predict`'s unhidden_ms).
    unhidden_ms: float = 0.0

    def to_dict(self) -> dict[str, float | str]:
        return dataclasses.asdict(self)


def predict(*, compute_ms: float, pipeline_ms: float, batch_size: int, overlapped: bool,
            unhidden_ms: float = 0.0) -> Prediction:
    """Step time, input wait and share for a device step of compute_ms fed by a pipeline that
    needs pipeline_ms per batch; overlapped when a prefetch lets the two run at the same time.
    unhidden_ms: the part of pipeline_ms that runs while no step does even with a prefetch (a shuffle
    buffer that takes in a whole epoch from storage before the epoch's first batch, per batch)."""
    _require_non_negative("compute_ms", compute_ms)
    _require_non_negative("pipeline_ms", pipeline_ms)
    _require_positive("batch_size", batch_size)
    _require_non_negative("unhidden_ms", unhidden_ms)
    unhidden = min(unhidden_ms, pipeline_ms)
    step = unhidden + max(compute_ms, pipeline_ms - unhidden) if overlapped else compute_ms + pipeline_ms
    wait = step - compute_ms
    share = wait / step if step > 0 else 0.0
    return Prediction(
        compute_ms=compute_ms, pipeline_ms=pipeline_ms, step_ms=step, input_wait_ms=wait,
        input_share=share, images_per_second=batch_size * 1000.0 / step if step > 0 else math.inf,
        verdict=verdict_for(share), unhidden_ms=unhidden,
    )


def device_step_ms(images_per_second: float, batch_size: int) -> float:
    """The compute time of one batch on a device of the given speed."""
    _require_positive("images_per_second", images_per_second)
    return batch_size * 1000.0 / images_per_second


def knee_images_per_second(*, pipeline_ms: float, batch_size: int) -> float:
    """The device speed above which input becomes the limit: the pipeline's own throughput."""
    _require_positive("pipeline_ms", pipeline_ms)
    return batch_size * 1000.0 / pipeline_ms


def highly_bound_above(*, pipeline_ms: float, batch_size: int, overlapped: bool) -> float:
    """The device speed from which the job is highly input-bound (share >= 20%).

    Overlapped: share = (p - c) / p, so c <= (1 - t) p. Serial: share = p / (c + p), so
    c <= p (1 - t) / t.
    """
    _require_positive("pipeline_ms", pipeline_ms)
    t = HIGHLY_INPUT_BOUND
    compute_limit = pipeline_ms * (1 - t) if overlapped else pipeline_ms * (1 - t) / t
    return batch_size * 1000.0 / compute_limit


@dataclasses.dataclass(frozen=True)
class DeviceWhatIf:
    device_images_per_second: float
    prediction: Prediction


def device_speeds_past(knee: float, speeds: Sequence[float] = DEFAULT_DEVICE_SPEEDS) -> tuple[float, ...]:
    """`speeds`, the fastest doubled on until one is at least twice the knee: the table shows where the
    pipeline becomes the limit however fast it is (a healthy pipeline on a fast machine passed 8,000
    images/s, and every row said 'not input-bound')."""
    _require_positive("knee", knee)
    out = list(speeds)
    while out[-1] < 2 * knee:
        out.append(out[-1] * 2)
    return tuple(out)


def accelerator_sweep(
    *, pipeline_ms: float, batch_size: int, overlapped: bool,
    device_speeds: Iterable[float] = DEFAULT_DEVICE_SPEEDS,
) -> list[DeviceWhatIf]:
    """The same pipeline against devices of other speeds."""
    return [
        DeviceWhatIf(speed, predict(compute_ms=device_step_ms(speed, batch_size), pipeline_ms=pipeline_ms,
                                    batch_size=batch_size, overlapped=overlapped))
        for speed in device_speeds
    ]


def pipeline_ms_with_cores(
    *, cpu_ms_per_image: float, cores: float, batch_size: int, floor_ms_per_image: float = 0.0,
) -> float:
    """Pipeline time per batch when its CPU work spreads over `cores` (parallel stages assumed),
    never below the per-image floor that more CPU cannot remove (storage)."""
    _require_non_negative("cpu_ms_per_image", cpu_ms_per_image)
    _require_positive("cores", cores)
    _require_non_negative("floor_ms_per_image", floor_ms_per_image)
    return batch_size * max(cpu_ms_per_image / cores, floor_ms_per_image)


@dataclasses.dataclass(frozen=True)
class CoresWhatIf:
    extra_cores: int
    cores: float
    pipeline_images_per_second: float
    prediction: Prediction


def cores_sweep(
    *, cpu_ms_per_image: float, cores: float, batch_size: int, compute_ms: float,
    floor_ms_per_image: float = 0.0, extra_cores: Sequence[int] = DEFAULT_EXTRA_CORES,
) -> list[CoresWhatIf]:
    """Throughput and input share with k more CPU cores, the pipeline's stages parallel and
    prefetched (a sequential pipeline uses one core whatever the machine has)."""
    rows = []
    for extra in extra_cores:
        if extra < 0:
            raise UsageError(f"extra_cores: expected integers >= 0, got {extra!r}")
        pipeline_ms = pipeline_ms_with_cores(cpu_ms_per_image=cpu_ms_per_image, cores=cores + extra,
                                             batch_size=batch_size, floor_ms_per_image=floor_ms_per_image)
        rows.append(CoresWhatIf(
            extra_cores=extra, cores=cores + extra,
            pipeline_images_per_second=batch_size * 1000.0 / pipeline_ms if pipeline_ms > 0 else math.inf,
            prediction=predict(compute_ms=compute_ms, pipeline_ms=pipeline_ms, batch_size=batch_size,
                               overlapped=True),
        ))
    return rows
