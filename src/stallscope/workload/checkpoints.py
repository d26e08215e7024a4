"""Checkpoints of a training run: model, optimizer and global step, so a killed run resumes.

`tf.train.Checkpoint` + `CheckpointManager` write `ckpt-<step>` files atomically (TF writes the
index last and updates the `checkpoint` state file after), so a run killed mid-save still finds
the previous checkpoint. `model.json` beside them (a `ModelSpec`) lets `evaluate` rebuild the model
with no model flags. An emulated-accelerator run has no model; its checkpoints hold the step only.
A directory that holds another run's kind of checkpoint (emulated vs real, another model, another
fine-tuning mode) or a damaged checkpoint is refused in one line saying what does not match.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from stallscope.errors import DataError, UsageError
from stallscope.workload.models import MODEL_SPEC_NAME, ModelSpec

log = logging.getLogger(__name__)

PREFIX = "ckpt"
_NUMBER = re.compile(rf"{PREFIX}-([0-9]+)\.index$")


class CheckpointStore:
    """Saves and restores {model, optimizer, step} under `directory`.

    `step` is a tf.Variable (int64) owned by the store; the training loop increments it.
    """

    def __init__(self, directory: Path, *, model=None, optimizer=None, spec: ModelSpec | None = None,
                 max_to_keep: int = 5) -> None:
        import tensorflow as tf

        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--checkpoint-path: cannot create {str(directory)!r} ({exc.strerror})") from None
        self.spec = spec
        self.has_model = model is not None
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        objects = {"step": self.step}
        if model is not None:
            objects["model"] = model
        if optimizer is not None:
            objects["optimizer"] = optimizer
        self.checkpoint = tf.train.Checkpoint(**objects)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(self.directory), max_to_keep=max_to_keep,
                                                  checkpoint_name=PREFIX)

    def check_spec_matches(self) -> None:
        """A resumed run must build the same model it saved; otherwise restoring would fail obscurely."""
        latest = self.latest
        if latest is not None:
            holds_model = checkpoint_holds_model(latest)
            if not self.has_model and holds_model:
                saved = describe_model(self.directory)
                raise UsageError(f"--checkpoint-path: {self.directory} holds checkpoints of a real {saved}; this run "
                                 "emulates an accelerator; use a new directory, or --accelerator real and that model")
            if self.has_model and not holds_model:
                ours = describe_spec(self.spec) if self.spec is not None else "a model"
                raise UsageError(f"--checkpoint-path: {self.directory} holds checkpoints of an "
                                 f"emulated-accelerator run (a step count, no model weights); this run trains {ours} "
                                 "with --accelerator real; use a new directory")
        if self.spec is None or not (self.directory / MODEL_SPEC_NAME).exists():
            return
        saved = ModelSpec.load(self.directory)
        ours = self.spec.to_dict()
        theirs = saved.to_dict()
        # fine_tune and batchnorm decide which variables train, so the optimizer's slots depend on them
        differing = [k for k in ("model", "num_classes", "image_size", "alpha", "fine_tune", "batchnorm")
                     if ours[k] != theirs[k]]
        if ours["input_range"] != theirs["input_range"]:  # the input adapter has no weights: it just follows
            log.info("pixels now arrive as %s (the checkpoints saw %s); the model's input adapter scales them",
                     ours["input_range"], theirs["input_range"])
        if differing:
            details = ", ".join(f"{k}: saved {theirs[k]!r}, now {ours[k]!r}" for k in differing)
            raise UsageError(f"--checkpoint-path: {self.directory} holds checkpoints of another model ({details}); "
                             "use a new directory or the same flags")

    def restore_latest(self) -> int:
        """Restores the newest checkpoint if there is one; returns the step it resumes from (0: fresh)."""
        self.check_spec_matches()
        latest = self.latest
        if latest is None:
            return 0
        try:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError) as exc:
            _quiet_unrestored_warnings()
            raise DataError(f"{latest}: does not match this run's model and optimizer "
                            f"({_first_line(exc)}); use a new --checkpoint-path") from None
        except _read_errors() as exc:
            raise _damaged(latest, exc) from None
        step = int(self.step.numpy())
        log.info("resumed from %s at step %d", latest, step)
        return step

    def save(self) -> str:
        if self.spec is not None:
            self.spec.save(self.directory)
        path = self.manager.save(checkpoint_number=self.step)
        log.info("saved checkpoint %s", path)
        return path

    @property
    def latest(self) -> str | None:
        """The newest complete checkpoint. A run killed after writing a checkpoint but before
        updating the `checkpoint` state file still resumes from it, so it is found by its files."""
        complete = list_checkpoints(self.directory)
        if complete:
            return complete[-1][1]
        return self.manager.latest_checkpoint


def list_checkpoints(directory: Path) -> list[tuple[int, str]]:
    """(step, checkpoint prefix) of every complete checkpoint in `directory`, oldest first.

    A checkpoint is complete once its `.index` file exists (TF writes it after the data files).
    """
    directory = Path(directory)
    found = []
    for index in directory.glob(f"{PREFIX}-*.index"):
        match = _NUMBER.search(index.name)
        if match:
            found.append((int(match.group(1)), str(index.with_suffix(""))))
    return sorted(found)


def restore_model(model, checkpoint_prefix: str) -> None:
    """Loads only the model's weights from a training checkpoint (optimizer slots are skipped)."""
    import tensorflow as tf

    if not checkpoint_holds_model(checkpoint_prefix):
        raise DataError(f"{checkpoint_prefix}: a checkpoint of an emulated-accelerator run (a step count, no model "
                        "weights); evaluate the checkpoints of a run with --accelerator real")
    try:
        status = tf.train.Checkpoint(model=model).restore(checkpoint_prefix)
        status.expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError) as exc:
        _quiet_unrestored_warnings()
        raise DataError(f"{checkpoint_prefix}: does not match the model in {MODEL_SPEC_NAME} "
                        f"({_first_line(exc)})") from None
    except _read_errors() as exc:
        raise _damaged(checkpoint_prefix, exc) from None


def checkpoint_holds_model(checkpoint_prefix: str) -> bool:
    """Whether a checkpoint has model weights (an emulated run's has the step only). Reads its index."""
    import tensorflow as tf

    try:
        names = tf.train.load_checkpoint(checkpoint_prefix).get_variable_to_shape_map()
    except _read_errors() as exc:
        raise _damaged(checkpoint_prefix, exc, index=True) from None
    return any(name.startswith("model/") for name in names)


def describe_spec(spec: ModelSpec) -> str:
    alpha = f" alpha {spec.alpha:g}," if spec.alpha != 1.0 else ""
    return (f"{spec.model} ({alpha} {spec.image_size} px, {spec.num_classes} classes, "
            f"fine-tune {spec.fine_tune})").replace("( ", "(")


def describe_model(directory: Path) -> str:
    """The model a checkpoint directory's model.json names, for messages."""
    try:
        return describe_spec(ModelSpec.load(directory))
    except (DataError, UsageError):
        return "model"


_UNRESTORED = ("Value in checkpoint could not be found", "Detecting that an object or model or tf.train.Checkpoint "
               "is being deleted with unrestored values")


def _unrestored_warning(record: logging.LogRecord) -> bool:
    """False for TF's warnings about values a failed restore left behind (the filter drops them)."""
    return not str(record.msg).startswith(_UNRESTORED)


def _quiet_unrestored_warnings() -> None:
    """A restore refused as another model's leaves values TF warns about, one line each, when the
    objects holding them are freed (105 lines after the one line, for another MobileNet's
    checkpoints; a failed restore returns no status to `expect_partial()` on): dropped here, once."""
    tf_logger = logging.getLogger("tensorflow")
    if _unrestored_warning not in tf_logger.filters:
        tf_logger.addFilter(_unrestored_warning)


def _read_errors() -> tuple[type[BaseException], ...]:
    """What TensorFlow raises on a truncated or corrupt checkpoint file (IndexError: data cut short)."""
    import tensorflow as tf

    return (tf.errors.OpError, IndexError)


def _damaged(checkpoint_prefix: str, exc: BaseException, *, index: bool = False) -> DataError:
    if index:
        name = f"{checkpoint_prefix}.index"
    else:
        data = sorted(Path(checkpoint_prefix).parent.glob(f"{Path(checkpoint_prefix).name}.data-*"))
        name = ", ".join(str(path) for path in data) or f"{checkpoint_prefix}.data-*"
    reason = exc.message if hasattr(exc, "message") and exc.message else str(exc)
    return DataError(f"{name}: cannot be read ({_first_line(reason)}); the checkpoint is damaged or incomplete: "
                     "use an earlier checkpoint or train again")


def _first_line(exc: BaseException | str) -> str:
    """The gist of a TensorFlow error: its first sentence, without the variable values it may list."""
    text = " ".join(str(exc).split())
    text = text.split(" Showing ")[0].split(" Unmatched ")[0]
    return text if len(text) <= 200 else text[:197] + "..."
