"""The fine-tuned model: a `keras.applications` base plus global pooling and a dense softmax head.

The base sees images in the range its ImageNet weights were trained on: the pipeline normalises
(seed: [-1, 1]) and a small `InputAdapter` layer maps that range to what the base expects (ResNet50
wants caffe-style BGR minus the ImageNet mean; EfficientNet rescales 0..255 itself), so pretrained
weights see familiar pixels whatever `--normalize` the pipeline used.

Fine-tuning: "head" freezes the base, "full" trains everything, "last:N" trains the last N layers
of the base. How its BatchNorm layers behave while they train ("frozen", "recalibrate" or
"momentum") is `batchnorm.py`'s business; the spec records the mode the run used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import socket
from pathlib import Path
from typing import Any

from stallscope.config import require_choice, require_positive
from stallscope.errors import DataError, UsageError
from stallscope.workload.batchnorm import apply_batchnorm, resolve_batchnorm

# Pixel ranges: the pipeline's `normalize` names and what each base expects.
RANGES = {"minus_one_one": (-1.0, 1.0), "zero_one": (0.0, 1.0), "none": (0.0, 255.0)}


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    name: str
    constructor: str        # attribute of keras.applications
    min_image_size: int     # smallest input side the base accepts
    expects: str            # "minus_one_one", "none" (0..255 in the model) or "caffe"
    has_alpha: bool = False  # MobileNet width multiplier


MODELS = {
    family.name: family
    for family in (
        ModelFamily("mobilenet", "MobileNet", 32, "minus_one_one", has_alpha=True),
        ModelFamily("mobilenet_v2", "MobileNetV2", 32, "minus_one_one", has_alpha=True),
        ModelFamily("inception_v3", "InceptionV3", 75, "minus_one_one"),
        ModelFamily("resnet50", "ResNet50", 32, "caffe"),
        ModelFamily("efficientnet_b0", "EfficientNetB0", 32, "none"),
    )
}
MOBILENET_ALPHAS = {"mobilenet": (0.25, 0.5, 0.75, 1.0), "mobilenet_v2": (0.35, 0.5, 0.75, 1.0, 1.3, 1.4)}
_LAST_N = re.compile(r"last:([0-9]+)")


def parse_weights(text: str) -> str:
    """'none', 'imagenet' or the path of a weights file for the base (`.h5`, `.weights.h5`, `.keras`)."""
    text = str(text).strip()
    if text.lower() in ("none", "imagenet"):
        return text.lower()
    path = Path(text)
    if not path.is_file():
        raise UsageError(f"--weights: expected 'none', 'imagenet' or an existing weights file, got {text!r}")
    return str(path)


def parse_fine_tune(text: str) -> str:
    text = str(text).strip().lower()
    if text in ("head", "full") or _LAST_N.fullmatch(text):
        if text.startswith("last:") and int(text[5:]) <= 0:
            raise UsageError(f"--fine-tune: last:N needs N >= 1, got {text!r}")
        return text
    raise UsageError(f"--fine-tune: expected 'head', 'full' or 'last:N' (e.g. last:20), got {text!r}")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What it takes to rebuild the model (saved as model.json beside checkpoints)."""

    model: str = "mobilenet"
    num_classes: int = 2
    image_size: int = 224
    alpha: float = 1.0
    weights: str = "none"
    fine_tune: str = "head"
    input_range: str = "minus_one_one"  # the pipeline's normalize
    labels: tuple[str, ...] = ()
    batchnorm: str | None = None  # None: the default for the weights (see batchnorm.py)

    def __post_init__(self) -> None:
        require_choice("model", self.model, MODELS)
        require_positive("num_classes", self.num_classes)
        require_positive("image_size", self.image_size)
        require_choice("input_range", self.input_range, RANGES)
        family = MODELS[self.model]
        if self.image_size < family.min_image_size:
            raise UsageError(f"image_size: {self.model} needs images of at least {family.min_image_size} pixels, "
                             f"got {self.image_size}")
        if family.has_alpha:
            if self.alpha not in MOBILENET_ALPHAS[self.model]:
                raise UsageError(f"alpha: {self.model} accepts {', '.join(map(str, MOBILENET_ALPHAS[self.model]))}, "
                                 f"got {self.alpha!r}")
        elif self.alpha != 1.0:
            raise UsageError(f"alpha: only mobilenet and mobilenet_v2 have a width multiplier; {self.model} got {self.alpha!r}")
        if self.labels and len(self.labels) != self.num_classes:
            raise UsageError(f"labels: {len(self.labels)} labels for num_classes={self.num_classes}")
        parse_fine_tune(self.fine_tune)
        object.__setattr__(self, "batchnorm", resolve_batchnorm(self.batchnorm, weights=self.weights,
                                                                fine_tune=self.fine_tune))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["labels"] = list(self.labels)
        return data

    def save(self, directory: Path) -> Path:
        from stallscope.records.manifest import write_json_atomic

        path = Path(directory) / MODEL_SPEC_NAME
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def load(cls, directory: Path) -> "ModelSpec":
        path = Path(directory) / MODEL_SPEC_NAME
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DataError(f"{path}: missing; expected a checkpoint directory written by `stallscope train "
                            "--checkpoint_path`") from None
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc})") from None
        from stallscope.config import from_dict

        return from_dict(cls, data, source=str(path))


MODEL_SPEC_NAME = "model.json"


def _adapter_transform(input_range: str, expects: str) -> tuple[float, float, bool]:
    """(scale, offset, caffe) so that x * scale + offset is in the base's expected range."""
    low, high = RANGES[input_range]
    if expects == "minus_one_one":
        target_low, target_high = -1.0, 1.0
    else:  # "none" and "caffe" both start from 0..255
        target_low, target_high = 0.0, 255.0
    scale = (target_high - target_low) / (high - low)
    return scale, target_low - low * scale, expects == "caffe"


DOWNLOAD_TIMEOUT_S = 60.0  # a stalled weights download ends in an error, not a silent wait


@contextlib.contextmanager
def _download_timeout(seconds: float):
    """Keras downloads with urllib and no timeout; a network that drops packets would wait forever."""
    saved = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(saved)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def build_model(spec: ModelSpec):
    """A compiled-free keras.Model: adapter -> base (no top) -> GlobalAveragePooling -> Dense softmax.

    Returns (model, base). `spec.weights` is 'none', 'imagenet' (Keras downloads them) or a file.
    """
    import keras

    family = MODELS[spec.model]
    size = spec.image_size
    kwargs: dict[str, Any] = {"include_top": False, "input_shape": (size, size, 3)}
    if family.has_alpha:
        kwargs["alpha"] = spec.alpha
    weights = spec.weights
    kwargs["weights"] = "imagenet" if weights == "imagenet" else None
    constructor = getattr(keras.applications, family.constructor)
    try:
        with _download_timeout(DOWNLOAD_TIMEOUT_S):
            base = constructor(**kwargs)
    except ValueError as exc:  # e.g. an input size or alpha the ImageNet weights do not exist for
        raise UsageError(f"--model {spec.model}: {exc}") from None
    except Exception as exc:  # the ImageNet download failed (offline)
        # Keras turns urllib's errors into a bare Exception("URL fetch failure on ..."); OSError covers
        # a socket timeout and a cache folder that cannot be written.
        if not (isinstance(exc, OSError) or str(exc).startswith("URL fetch failure")):
            raise
        raise UsageError(f"--weights: expected ImageNet weights Keras can download, got no download of the "
                         f"{spec.model} weights ({_one_line(exc)}); give a local weights file with --weights PATH "
                         f"or use --weights none") from None
    if weights not in ("none", "imagenet"):
        try:
            base.load_weights(weights)
        except (ValueError, OSError, KeyError) as exc:
            raise UsageError(f"--weights: {weights!r} does not fit the {spec.model} base at "
                             f"{size}x{size} (alpha {spec.alpha}): {exc}") from None
    apply_fine_tune(base, spec.fine_tune)
    apply_batchnorm(base, spec.batchnorm)

    scale, offset, caffe = _adapter_transform(spec.input_range, family.expects)
    inputs = keras.Input((size, size, 3), name="images")
    x = input_adapter_class()(scale=scale, offset=offset, caffe=caffe, name="input_adapter")(inputs)
    x = base(x, training=False)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(spec.num_classes, activation="softmax", name="predictions")(x)
    return keras.Model(inputs, outputs, name=f"{spec.model}_finetune"), base


def apply_fine_tune(base, fine_tune: str) -> None:
    """Sets which base layers train: none ("head"), all ("full") or the last N ("last:N")."""
    fine_tune = parse_fine_tune(fine_tune)
    if fine_tune == "head":
        base.trainable = False
        return
    base.trainable = True
    if fine_tune == "full":
        return
    count = int(fine_tune[5:])
    layers = base.layers
    if count > len(layers):
        raise UsageError(f"--fine-tune: last:{count} asks for more layers than the base's {len(layers)}")
    for layer in layers[: len(layers) - count]:
        layer.trainable = False


@functools.cache
def input_adapter_class():
    """The InputAdapter layer class, defined on first use so that importing this module needs no Keras."""
    import keras

    @keras.saving.register_keras_serializable(package="stallscope")
    class InputAdapter(keras.layers.Layer):
        """x * scale + offset; with caffe=True, then RGB->BGR minus the ImageNet channel means."""

        def __init__(self, scale: float = 1.0, offset: float = 0.0, caffe: bool = False, **kwargs):
            super().__init__(**kwargs)
            self.scale, self.offset, self.caffe = float(scale), float(offset), bool(caffe)

        def call(self, inputs):
            x = inputs * self.scale + self.offset if (self.scale, self.offset) != (1.0, 0.0) else inputs
            if self.caffe:
                x = keras.ops.flip(x, axis=-1) - keras.ops.convert_to_tensor([103.939, 116.779, 123.68], x.dtype)
            return x

        def get_config(self):
            return {**super().get_config(), "scale": self.scale, "offset": self.offset, "caffe": self.caffe}

    return InputAdapter

