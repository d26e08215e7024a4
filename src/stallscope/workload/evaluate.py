"""Top-1/top-5 accuracy and loss of a checkpoint on a split: once, or on every new checkpoint.

The model is rebuilt from `model.json` beside the checkpoints (written by `train`), so evaluation
needs no model flags; the pipeline is the fast, order-keeping one below, over every example.
`--watch` follows a training run as seed-003's eval script did: it evaluates each checkpoint that
appears, sleeping `interval_secs` between looks.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stallscope.config import AUTOTUNE, require_positive
from stallscope.errors import DataError, UsageError
from stallscope.pipeline.config import PipelineConfig
from stallscope.pipeline.input_errors import data_errors, input_error, store_error, store_errors
from stallscope.storage.location import as_path
from stallscope.workload.checkpoints import checkpoint_holds_model, list_checkpoints, restore_model
from stallscope.workload.models import MODEL_SPEC_NAME, ModelSpec

log = logging.getLogger(__name__)


def evaluation_pipeline(train_pipeline: PipelineConfig | None = None, *, image_size: int | None = None,
                        batch_size: int | None = None, normalize: str | None = None) -> PipelineConfig:
    """Every example once, in order, as fast as the cores allow, preprocessed like training (read as
    training read; on its own, gs:// through the pooled reader where obstore is installed)."""
    from stallscope.storage import gcs_obstore

    base = train_pipeline or PipelineConfig(preset="evaluate",
                                            gcs_reader="pooled" if gcs_obstore.available() else "tf")
    return base.replace(
        preset="evaluate",
        image_size=image_size or base.image_size,
        batch_size=batch_size or base.batch_size,
        normalize=normalize or base.normalize,
        shuffle_buffer=0,
        map_parallelism=AUTOTUNE,
        prefetch=AUTOTUNE,
        cache="none",
        drop_remainder=False,
        deterministic=True,
    )


@dataclasses.dataclass(frozen=True)
class EvalResult:
    examples: int
    top1: float
    top5: float
    loss: float
    k: int  # top-k used for "top5" (min(5, classes))
    checkpoint: str = ""
    step: int | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def evaluate_model(model, dataset, source=None) -> EvalResult:
    """Accuracy and mean cross-entropy of `model` over a dataset of (images, one-hot labels); `source`
    (the DataSource it reads) lets a damaged, vanished or unreadable input be named in one line."""
    import keras
    import tensorflow as tf

    classes = int(model.output_shape[-1])
    k = min(5, classes)

    @tf.function
    def batch_metrics(images, labels):
        probabilities = model(images, training=False)
        truth = tf.argmax(labels, axis=-1, output_type=tf.int32)
        top1 = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(probabilities, axis=-1, output_type=tf.int32), truth),
                                     tf.float64))
        topk = tf.reduce_sum(tf.cast(tf.math.in_top_k(truth, probabilities, k), tf.float64))
        loss = tf.reduce_sum(tf.cast(keras.losses.categorical_crossentropy(labels, probabilities), tf.float64))
        return top1, topk, loss, tf.shape(images)[0]

    started = time.perf_counter()
    total = correct1 = correctk = loss_sum = 0.0
    try:
        for images, labels in dataset:
            top1, topk, loss, count = batch_metrics(images, labels)
            correct1 += float(top1)
            correctk += float(topk)
            loss_sum += float(loss)
            total += int(count)
    except data_errors() as exc:
        raise input_error(source, exc) from None  # names the shard or image
    except store_errors() as exc:
        raise store_error(source, exc) from None  # TF's gs:// gave up on the store
    except tf.errors.UnknownError as exc:
        from stallscope.storage.tfdata_readers import storage_failure
        if storage_failure(exc) is None:
            raise
        raise storage_failure(exc) from None  # the store failed mid-run: one line (not kept in a local)
    if total == 0:
        raise DataError("evaluation: the split yielded no examples")
    return EvalResult(examples=int(total), top1=correct1 / total, top5=correctk / total, loss=loss_sum / total,
                      k=k, seconds=time.perf_counter() - started)


@dataclasses.dataclass(frozen=True)
class EvaluateOptions:
    """checkpoint_path: a directory written by `train --checkpoint_path` (model.json + ckpt-*).
    max_evaluations: with watch, stop after this many (None: until interrupted)."""

    checkpoint_path: Path
    dataset_path: Path
    source: str = "files"
    split: str = "validation"
    labels_file: Path | None = None
    batch_size: int = 32
    watch: bool = False
    interval_secs: float = 300.0
    max_evaluations: int | None = None
    log_path: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "checkpoint_path", Path(self.checkpoint_path))
        object.__setattr__(self, "dataset_path", as_path(self.dataset_path))
        if self.checkpoint_path.exists() and not self.checkpoint_path.is_dir():
            raise UsageError(f"--checkpoint-path: expected a checkpoint folder, got {str(self.checkpoint_path)!r} "
                             f"(a file)")
        if not self.watch and not self.checkpoint_path.exists():  # --watch waits for it to appear
            raise UsageError(f"--checkpoint-path: expected a checkpoint folder, got {str(self.checkpoint_path)!r} "
                             f"(it does not exist)")
        require_positive("batch_size", self.batch_size)
        require_positive("max_evaluations", self.max_evaluations, allow_none=True)
        if not self.interval_secs > 0:
            raise UsageError(f"--interval-secs: expected a number above 0, got {self.interval_secs!r}")


def label_difference(data: Sequence[str], checkpoint: Sequence[str], shown: int = 5) -> str:
    """What differs between the data's labels and the checkpoint's, in a few words: the counts, the
    labels only one side has, or the first place where the same labels stand in another order."""

    def some(names: list[str]) -> str:
        return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")

    only_data = [name for name in data if name not in set(checkpoint)]
    only_checkpoint = [name for name in checkpoint if name not in set(data)]
    parts = [f"{len(data)} labels in the data, {len(checkpoint)} in the checkpoint"]
    if only_data:
        parts.append(f"only in the data: {some(only_data)}")
    if only_checkpoint:
        parts.append(f"only in the checkpoint: {some(only_checkpoint)}")
    if not only_data and not only_checkpoint:
        at = next((i for i, (a, b) in enumerate(zip(data, checkpoint)) if a != b), None)
        if at is not None:
            parts.append(f"the same labels in another order (number {at}: {data[at]} in the data, {checkpoint[at]} "
                         "in the checkpoint)")
    return "; ".join(parts)


class Evaluator:
    """Builds the model and the evaluation dataset once; evaluates any checkpoint of the directory."""

    def __init__(self, options: EvaluateOptions) -> None:
        from stallscope.tfimport import import_tensorflow

        tf = import_tensorflow()
        from stallscope.pipeline.builder import build_dataset
        from stallscope.pipeline.sources import open_source
        from stallscope.workload.models import build_model

        self.options = options
        checkpoints = list_checkpoints(options.checkpoint_path)
        if checkpoints and not (options.checkpoint_path / MODEL_SPEC_NAME).exists() \
                and not checkpoint_holds_model(checkpoints[-1][1]):
            raise DataError(f"--checkpoint-path: {options.checkpoint_path} holds checkpoints of an "
                            "emulated-accelerator run (a step count, no model weights): nothing to evaluate; "
                            "give the checkpoints of a run with --accelerator real")
        self.spec = ModelSpec.load(options.checkpoint_path)
        self.source = source = open_source(options.source, options.dataset_path, options.split, options.labels_file)
        if self.spec.labels and tuple(source.labels) != tuple(self.spec.labels):
            raise DataError(f"{options.dataset_path}: its labels differ from the checkpoint's "
                            f"({options.checkpoint_path / 'model.json'}): "
                            f"{label_difference(source.labels, self.spec.labels)}")
        if source.num_classes != self.spec.num_classes:
            raise DataError(f"{options.dataset_path}: {source.num_classes} classes, the checkpoint's model has "
                            f"{self.spec.num_classes}")
        # The base's pretrained weights come from the checkpoint, so nothing is downloaded or read here.
        self.model, _ = build_model(dataclasses.replace(self.spec, weights="none"))
        config = evaluation_pipeline(image_size=self.spec.image_size, batch_size=options.batch_size,
                                     normalize=self.spec.input_range)
        self.dataset = build_dataset(config, source, num_classes=self.spec.num_classes)
        self.writer = (tf.summary.create_file_writer(str(options.log_path)) if options.log_path is not None
                       else None)

    def evaluate(self, checkpoint: str, step: int | None = None) -> EvalResult:
        restore_model(self.model, checkpoint)
        result = dataclasses.replace(evaluate_model(self.model, self.dataset, self.source), checkpoint=checkpoint, step=step)
        if self.writer is not None:
            import tensorflow as tf

            with self.writer.as_default():
                for name in ("top1", "top5", "loss"):
                    tf.summary.scalar(f"evaluation/{name}", getattr(result, name), step=step or 0)
            self.writer.flush()
        return result


def evaluate_latest(options: EvaluateOptions) -> EvalResult:
    checkpoints = list_checkpoints(options.checkpoint_path)
    if not checkpoints:
        raise DataError(f"{options.checkpoint_path}: no checkpoint (ckpt-*.index) to evaluate")
    step, prefix = checkpoints[-1]
    return Evaluator(options).evaluate(prefix, step)


def watch(options: EvaluateOptions, on_result: Callable[[EvalResult], None],
          *, sleep: Callable[[float], None] = time.sleep) -> int:
    """Evaluates every new checkpoint as it appears; returns how many were evaluated.

    Stops after `max_evaluations` (or on KeyboardInterrupt, which propagates to the caller).
    """
    evaluator: Evaluator | None = None
    seen: set[str] = set()
    done = 0
    while options.max_evaluations is None or done < options.max_evaluations:
        fresh = [(step, prefix) for step, prefix in list_checkpoints(options.checkpoint_path) if prefix not in seen]
        if fresh and evaluator is None:
            evaluator = Evaluator(options)
        if fresh:
            step, prefix = fresh[-1]  # the newest; older unseen ones are superseded, as in seed-003
            seen.update(p for _, p in fresh)
            on_result(evaluator.evaluate(prefix, step))
            done += 1
            continue
        log.info("no new checkpoint in %s; next look in %gs", options.checkpoint_path, options.interval_secs)
        sleep(options.interval_secs)
    return done
