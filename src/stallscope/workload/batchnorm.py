"""BatchNormalization while fine-tuning: which mode a run uses, and recomputing moving statistics.

Under Keras 3 an outer `model(images, training=True)` reaches BatchNorm layers inside the base even
though the base was called with `training=False`, so a trainable BatchNorm layer normalises with
batch statistics during training while inference uses its moving averages, which after a short
run (momentum 0.99) still mostly hold their starting values: the trained model then evaluates at
chance. Three modes:

- "frozen": every BatchNorm layer of the base is made non-trainable, which in Keras 3 means it
  always runs in inference mode and keeps its moving statistics (and its scale and offset). This is
  the transfer-learning guide's advice for a pretrained base: its ImageNet statistics survive.
- "recalibrate": trainable BatchNorm layers learn on batch statistics; before a model is saved,
  validated or handed back, their moving mean and variance are recomputed over a few hundred
  training images with the trained weights ("precise BN"), so inference matches training. The
  default for a base trained from scratch, whose starting statistics mean nothing: the layers that
  stay frozen (`last:N`) get statistics of their random weights once, before the first step, or
  their activations would fade to zero through the frozen part and nothing could learn.
- "momentum": Keras' own behaviour, moving averages updated with momentum 0.99 only; they catch
  up with the weights only after many hundreds of steps.

A base that does not train (`--fine_tune head`) runs every BatchNorm layer in inference mode anyway.
"""

from __future__ import annotations

import logging

from stallscope.errors import UsageError
from stallscope.workload.accelerator import batch_examples

log = logging.getLogger(__name__)

BATCHNORM_MODES = ("frozen", "recalibrate", "momentum")
DEFAULT_RECALIBRATION_IMAGES = 512


def default_batchnorm(weights: str) -> str:
    """Pretrained weights keep their statistics; a base trained from scratch has none worth keeping."""
    return "recalibrate" if weights == "none" else "frozen"


def resolve_batchnorm(mode: str | None, *, weights: str, fine_tune: str) -> str:
    """The mode a run uses: `mode` as asked, or the default for its weights (None)."""
    if mode is None:
        return "frozen" if fine_tune == "head" else default_batchnorm(weights)
    text = str(mode).strip().lower()
    if text not in BATCHNORM_MODES:
        raise UsageError(f"--batchnorm: expected one of {', '.join(BATCHNORM_MODES)}, got {mode!r}")
    if fine_tune == "head" and text != "frozen":
        raise UsageError(f"--batchnorm {text}: --fine-tune head trains no base layer, so every BatchNorm layer "
                         "runs in inference mode; use --fine-tune full or last:N, or leave --batchnorm out")
    return text


def batchnorm_layers(base) -> list:
    """The BatchNormalization layers of `base`, nested models included, in order."""
    import keras

    found = []
    for layer in getattr(base, "layers", ()):
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(layer)
        found.extend(batchnorm_layers(layer))
    return found


def apply_batchnorm(base, mode: str) -> None:
    """Called after the fine-tuning mode set which layers train: "frozen" takes BatchNorm out of them."""
    if mode == "frozen":
        for layer in batchnorm_layers(base):
            layer.trainable = False


def trained_batchnorm_layers(base) -> list:
    """The BatchNorm layers that learn on batch statistics in this run (the ones to recalibrate)."""
    return [layer for layer in batchnorm_layers(base) if layer.trainable]


def recalibrate(model, layers: list, batches) -> int:
    """Sets the moving mean and variance of `layers` to their inputs' statistics over `batches`.

    Runs `model` in training mode (each listed layer, made trainable for the pass, then normalises with
    its batch's statistics, as in training) with momentum 0, so after each batch a layer's moving
    mean and variance are that batch's; they are pooled per image into the population mean and
    variance and written at the end. A failure (or Ctrl-C) part-way puts the previous statistics
    back. Returns the images used.
    """
    import numpy as np

    if not layers:
        return 0
    before = [(layer.moving_mean.numpy(), layer.moving_variance.numpy(), layer.momentum, layer.trainable)
              for layer in layers]
    sums = [[np.zeros(layer.moving_mean.shape, np.float64), np.zeros(layer.moving_mean.shape, np.float64)]
            for layer in layers]
    images = 0
    completed = False
    try:
        for layer in layers:
            layer.momentum, layer.trainable = 0.0, True
        for batch in batches:
            inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
            count = batch_examples(inputs)
            model(inputs, training=True)
            for (mean_sum, square_sum), layer in zip(sums, layers):
                mean = layer.moving_mean.numpy().astype(np.float64)
                mean_sum += count * mean
                square_sum += count * (layer.moving_variance.numpy().astype(np.float64) + mean * mean)
            images += count
        completed = images > 0
    finally:
        for (mean, variance, momentum, trainable), layer in zip(before, layers):
            layer.momentum, layer.trainable = momentum, trainable
            if not completed:
                layer.moving_mean.assign(mean)
                layer.moving_variance.assign(variance)
    if not completed:
        return 0
    for (mean_sum, square_sum), layer in zip(sums, layers):
        mean = mean_sum / images
        layer.moving_mean.assign(mean.astype(np.float32))
        layer.moving_variance.assign(np.maximum(square_sum / images - mean * mean, 0.0).astype(np.float32))
    log.info("recalibrated the moving statistics of %d BatchNorm layer(s) over %d image(s)", len(layers), images)
    return images
