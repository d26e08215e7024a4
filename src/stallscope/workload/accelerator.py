"""The device a training step runs on: the real model, or an emulated accelerator of a given speed.

On a CPU-only machine the model's compute is the bottleneck and input stalls cannot show. An
emulated accelerator replaces the model step with a wait that uses no CPU and lasts as long as a
device of the given speed would take for the batch, while the input pipeline still produces every
batch in full (the iterator hands back computed tensors; the step holds them until its wait ends).
This answers "would my pipeline keep a fast device fed?" without one.

Spellings: `real`, `emulated:2000` (images per second), `emulated:15ms` (milliseconds per step).
"""

from __future__ import annotations

import dataclasses
import re
import threading

from stallscope.config import require_choice
from stallscope.errors import UsageError

KINDS = ("real", "emulated")
TRACE_NAME = "emulated_accelerator"  # the profiler region of the emulated step
_SPEC = re.compile(r"emulated:\s*([0-9]+(?:\.[0-9]+)?)\s*(ms)?", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """kind: "real" runs the model; "emulated" waits. An emulated one has exactly one speed:
    images_per_second (the wait scales with the batch) or ms_per_step (fixed per step)."""

    kind: str = "real"
    images_per_second: float | None = None
    ms_per_step: float | None = None

    def __post_init__(self) -> None:
        require_choice("accelerator", self.kind, KINDS)
        speeds = [v for v in (self.images_per_second, self.ms_per_step) if v is not None]
        if self.kind == "real" and speeds:
            raise UsageError(f"accelerator: 'real' takes no speed, got {self.spec!r}")
        if self.kind == "emulated":
            if len(speeds) != 1:
                raise UsageError("accelerator: 'emulated' needs exactly one of images_per_second or ms_per_step, "
                                 f"got images_per_second={self.images_per_second!r}, ms_per_step={self.ms_per_step!r}")
            if not speeds[0] > 0:
                raise UsageError(f"accelerator: the emulated speed must be above 0, got {speeds[0]!r}")

    @property
    def emulated(self) -> bool:
        return self.kind == "emulated"

    @property
    def spec(self) -> str:
        """The flag spelling that parses back to this accelerator."""
        if self.images_per_second is not None:
            return f"emulated:{self.images_per_second:g}"
        if self.ms_per_step is not None:
            return f"emulated:{self.ms_per_step:g}ms"
        return "real"

    def step_seconds(self, images: int) -> float:
        """How long the emulated device computes a batch of `images`."""
        if self.images_per_second is not None:
            return images / self.images_per_second
        if self.ms_per_step is not None:
            return self.ms_per_step / 1000.0
        raise UsageError("accelerator: a real accelerator has no emulated step time")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "spec": self.spec, "images_per_second": self.images_per_second,
                "ms_per_step": self.ms_per_step}


def parse_accelerator(text: str) -> Accelerator:
    """`real`, `emulated:IMAGES_PER_SECOND` or `emulated:MS_PER_STEPms`."""
    cleaned = str(text).strip()
    if cleaned.lower() == "real":
        return Accelerator()
    match = _SPEC.fullmatch(cleaned)
    if not match:
        raise UsageError(f"--accelerator: expected 'real', 'emulated:IMAGES_PER_SECOND' (e.g. emulated:2000) "
                         f"or 'emulated:MS_PER_STEPms' (e.g. emulated:15ms), got {text!r}")
    value = float(match.group(1))
    if match.group(2):
        return Accelerator(kind="emulated", ms_per_step=value)
    return Accelerator(kind="emulated", images_per_second=value)


def batch_examples(batch) -> int:
    """The examples in a batch of any structure (a tensor, a tuple, a dict of features): the first
    dimension of its first tensor that has one; 1 where every part is a scalar (an unbatched element)."""
    import tensorflow as tf

    for part in tf.nest.flatten(batch):
        shape = getattr(part, "shape", None)
        if shape is not None and len(shape) > 0 and shape[0] is not None:
            return int(shape[0])
    return 1


class EmulatedDevice:
    """Runs emulated steps: a wait on an event (no CPU used) of the device's step time.

    `stop()` ends a wait early, so a run can be interrupted without sleeping out a slow device.
    """

    def __init__(self, accelerator: Accelerator) -> None:
        if not accelerator.emulated:
            raise UsageError(f"accelerator: EmulatedDevice needs an emulated accelerator, got {accelerator.spec!r}")
        self.accelerator = accelerator
        self._stop = threading.Event()

    def run_step(self, batch) -> int:
        """Consumes one batch (images and labels, or any structure of tensors a user's dataset yields:
        dicts of features, several inputs): waits as long as the device would compute on it.

        Returns the number of examples in the batch: the first dimension of its first tensor.
        """
        count = batch_examples(batch)
        self._stop.wait(self.accelerator.step_seconds(count))
        return count

    def stop(self) -> None:
        self._stop.set()
