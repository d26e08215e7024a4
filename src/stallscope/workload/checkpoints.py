"""Checkpoints of a training run: model, optimizer and global step, so a killed run resumes.

`tf.train.Checkpoint` + `CheckpointManager` write `ckpt-<step>` files atomically (TF writes the
index last and updates the `checkpoint` state file after), so a run killed mid-save still finds
the previous checkpoint. `model.json` beside them (a `ModelSpec`) lets `evaluate` rebuild the model
with no model flags. An emulated-accelerator run has no model; its checkpoints hold the step only.
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
        if self.spec is None or not (self.directory / MODEL_SPEC_NAME).exists():
            return
        saved = ModelSpec.load(self.directory)
        ours = self.spec.to_dict()
        theirs = saved.to_dict()
        differing = [k for k in ("model", "num_classes", "image_size", "alpha") if ours[k] != theirs[k]]
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
            raise DataError(f"{latest}: does not match this run's model and optimizer ({exc})") from None
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

    status = tf.train.Checkpoint(model=model).restore(checkpoint_prefix)
    try:
        status.expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError) as exc:
        raise DataError(f"{checkpoint_prefix}: does not match the model in {MODEL_SPEC_NAME} ({exc})") from None
