"""The fine-tuning loop: a custom loop (not `model.fit`) so every step is timed cheaply.

Per step: input wait = time blocked on `next(iterator)`; compute = the train step (a tf.function
whose loss is read back, which forces completion so asynchronous execution cannot hide time) or
the emulated accelerator's wait. Warm-up steps (tracing, first fills) are marked and left out of
the means. Everything a run measures lands in its run directory (see `rundir.py`).

Library use (the diagnosis calls this for short probes):

    result = run_training(TrainOptions(source="files", dataset_path=path, pipeline=config,
                                       accelerator="emulated:2000", steps=50))
    result.summary["input_share"], result.steps, result.run_dir

`dataset=` feeds a prebuilt `tf.data.Dataset` of (images, one-hot labels) instead of building one
(e.g. batches cached in memory for a compute-only probe); the source still names the classes.
`source=` passes the `DataSource` of the options when the caller has opened it already, so a series
of short runs (the diagnosis' probes) does not scan the data set again for each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import math
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stallscope.config import json_ready, require_choice, require_non_negative, require_positive
from stallscope.errors import DataError, UsageError
from stallscope.pipeline.config import PipelineConfig
from stallscope.pipeline.input_errors import data_errors, input_error, store_error, store_errors
from stallscope.pipeline.sources import SOURCE_KINDS
from stallscope.storage import request_tally
from stallscope.storage.location import as_path
from stallscope.storage.request_tally import RequestTally
from stallscope.storage.served_counters import served_counters_for
from stallscope.storage.under import storage_under
from stallscope.version import __version__
from stallscope.workload import rundir
from stallscope.workload.batchnorm import DEFAULT_RECALIBRATION_IMAGES, resolve_batchnorm
from stallscope.workload.cold_start import start_cold
from stallscope.workload.accelerator import TRACE_NAME, Accelerator, EmulatedDevice, parse_accelerator
from stallscope.workload.models import MODELS, ModelSpec, parse_fine_tune, parse_weights
from stallscope.workload.precision import PrecisionTarget, measure_precision, target_met
from stallscope.workload.profiling import ProfileWindow, StepProfiler, parse_profile_steps
from stallscope.workload.resources import ResourceMonitor, per_image
from stallscope.workload.step_io import BASIS_MEANING, StepIoCounter
from stallscope.workload.timing import StepClock, StepStats, format_step_line, summarize_steps

log = logging.getLogger(__name__)

DEFAULT_RUNS_DIR = Path("runs")


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """One training run.

    steps: train until this global step (a resumed run continues to it); None trains `epochs`
        passes over `dataset_size` examples (default: the whole split).
    accelerator: "real", "emulated:IMAGES_PER_SECOND" or "emulated:MS_PER_STEPms" (or an Accelerator).
    weights: "none", "imagenet" (Keras downloads them) or the path of a weights file for the base.
    fine_tune: "head" (frozen base), "full", or "last:N" (the last N base layers train).
    batchnorm: "frozen", "recalibrate" or "momentum" (see batchnorm.py); None: the default for `weights`
        and `fine_tune` (`batchnorm_mode`), so a copy with another fine_tune gets that one's default.
    recalibration_images: training images whose statistics "recalibrate" writes into BatchNorm layers.
    log_path: the run directory; None makes runs/<timestamp>-<model>-<source>.
    checkpoint_path: where checkpoints go (and are resumed from); None: no checkpoints.
    profile_steps: (start, stop) global steps to profile, or "START:STOP"; needs nothing else.
    warmup_steps: first steps of this process left out of the means (tf.function tracing).
    data_service_timeout_s: with `pipeline.data_service`, how long one wait for a batch from the service
        may last before the run ends in one line (TF itself would wait for ever).
    precision: a PrecisionTarget: run (the data repeating) until the images/s of the measured steps'
        two halves agree within its tolerance (precision.py); not with `steps`, which fixes the length.
    cold: evict the data's files from the page cache first, where a cache across runs exists (local
        files, a mount; cold_start.py); gs:// and s3:// start cold anyway, which the summary says.
    """

    source: str
    dataset_path: Path
    pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)
    split: str = "train"
    validation_path: Path | None = None
    validation_split: str = "validation"
    labels_file: Path | None = None
    model: str = "mobilenet"
    alpha: float = 1.0
    weights: str = "none"
    fine_tune: str = "head"
    batchnorm: str | None = None
    recalibration_images: int = DEFAULT_RECALIBRATION_IMAGES
    steps: int | None = None
    epochs: int = 1
    dataset_size: int | None = None
    learning_rate: float = 1e-4
    accelerator: Any = "real"
    log_path: Path | None = None
    checkpoint_path: Path | None = None
    checkpoint_every: int = 500
    max_checkpoints: int = 5
    profile_steps: Any = None
    warmup_steps: int = 2
    log_every: int = 10
    seed: int = 0
    data_service_timeout_s: float = 30.0
    precision: PrecisionTarget | None = None
    cold: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # normalise spellings once, so everything downstream sees one form
        require_choice("source", self.source, SOURCE_KINDS)
        if not isinstance(self.pipeline, PipelineConfig):
            raise UsageError(f"pipeline: expected a PipelineConfig, got {type(self.pipeline).__name__}")
        set_(self, "dataset_path", as_path(self.dataset_path))
        for name in ("validation_path", "labels_file", "log_path", "checkpoint_path"):
            if getattr(self, name) is not None:
                set_(self, name, (as_path if name == "validation_path" else Path)(getattr(self, name)))
        require_choice("model", self.model, MODELS)
        set_(self, "weights", parse_weights(self.weights))
        set_(self, "fine_tune", parse_fine_tune(self.fine_tune))
        if self.batchnorm is not None:
            set_(self, "batchnorm", resolve_batchnorm(self.batchnorm, weights=self.weights, fine_tune=self.fine_tune))
        require_positive("recalibration_images", self.recalibration_images)
        require_positive("steps", self.steps, allow_none=True)
        require_positive("epochs", self.epochs)
        require_positive("dataset_size", self.dataset_size, allow_none=True)
        if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, (int, float)) \
                or not self.learning_rate > 0:
            raise UsageError(f"learning_rate: expected a number above 0, got {self.learning_rate!r}")
        if not isinstance(self.accelerator, Accelerator):
            set_(self, "accelerator", parse_accelerator(self.accelerator))
        if self.profile_steps is not None and not isinstance(self.profile_steps, ProfileWindow):
            window = self.profile_steps
            set_(self, "profile_steps", parse_profile_steps(window) if isinstance(window, str)
                 else ProfileWindow(*window))
        require_positive("checkpoint_every", self.checkpoint_every)
        require_positive("max_checkpoints", self.max_checkpoints)
        require_non_negative("warmup_steps", self.warmup_steps)
        require_positive("log_every", self.log_every)
        if isinstance(self.data_service_timeout_s, bool) or not isinstance(self.data_service_timeout_s, (int, float)) \
                or not self.data_service_timeout_s > 0:
            raise UsageError(f"data_service_timeout_s: expected seconds above 0, got {self.data_service_timeout_s!r}")
        if self.precision is not None:
            if not isinstance(self.precision, PrecisionTarget):
                raise UsageError(f"precision: expected a PrecisionTarget, got {type(self.precision).__name__}")
            if self.steps is not None:
                raise UsageError("--precision: runs until its figure is that precise; --steps fixes the length "
                                 "instead: give one of them")
        if not self.accelerator.emulated:
            self.model_spec(("class",))  # model, alpha and image size checked before any data is read
        if self.validation_path is not None and self.accelerator.emulated:
            raise UsageError("--validation-path: an emulated accelerator has no model to validate; "
                             "use --accelerator real")

    @property
    def repeats(self) -> bool:
        """The data repeats: the run's length is steps or a precision, not epochs."""
        return self.steps is not None or self.precision is not None

    @property
    def batchnorm_mode(self) -> str:
        return resolve_batchnorm(self.batchnorm, weights=self.weights, fine_tune=self.fine_tune)

    def model_spec(self, labels: tuple[str, ...]) -> ModelSpec:
        return ModelSpec(model=self.model, num_classes=len(labels), image_size=self.pipeline.image_size,
                         alpha=self.alpha, weights=self.weights, fine_tune=self.fine_tune,
                         input_range=self.pipeline.normalize, labels=tuple(labels), batchnorm=self.batchnorm_mode)


@dataclasses.dataclass(frozen=True)
class StepProgress:
    """Handed to `on_step` after every step; `log_line` is set every `log_every` steps."""

    record: rundir.StepRecord
    loss: float | None
    total_steps: int | None
    log_line: str | None


@dataclasses.dataclass(frozen=True)
class TrainResult:
    steps: list[rundir.StepRecord]
    summary: dict[str, Any]
    run_dir: Path
    stats: StepStats
    model: Any = dataclasses.field(default=None, repr=False)  # the keras.Model (None when emulated)


def new_run_dir(model: str, source: str, *, root: Path = DEFAULT_RUNS_DIR) -> Path:
    """runs/<timestamp>-<model>-<source>, unique even for runs started in the same second."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{stamp}-{model}-{source}"
    candidate, counter = base, 1
    while candidate.exists():
        counter += 1
        candidate = base.with_name(f"{base.name}-{counter}")
    return candidate


def _make_run_dir(options: TrainOptions) -> tuple[Path, list[Path]]:
    """(the run directory, the folders this call made for it, deepest first): a run that fails before
    its first step removes only those (`_remove_run_without_steps`)."""
    model = "emulated" if options.accelerator.emulated else options.model
    run_dir = options.log_path if options.log_path is not None else new_run_dir(model, options.source)
    rundir.claim_run_dir(run_dir, flag="--log-path")  # before any work: a file of the user's is never replaced
    made = _folders_missing(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--log-path: cannot create {str(run_dir)!r} ({exc.strerror})") from None
    return run_dir, made


def _folders_missing(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first: what mkdir(parents=True) makes."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing


def _remove_run_without_steps(run_dir: Path, made: list[Path], loop: "_StepLoop | None") -> None:
    """A run that fails before its first step leaves no folder that would pass for a run (the CLI names
    none). Only what this call wrote goes, where it made the run directory: its writer's events files
    (the writer closed first: TF re-creates a deleted one), then the folders, each only while empty."""
    if loop is not None:
        loop.writer.close()
        if loop.steps:
            return  # partial figures: kept, and no summary.json says the run did not finish
    if run_dir not in made:
        return  # the user's folder, or a resumed run's: left as it was found, but for the events file
    events = run_dir / "train"
    for name in events.glob("events.out.tfevents.*"):
        name.unlink()
    for folder in (events, *made):
        try:
            folder.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return  # holds something this call did not write: kept


@dataclasses.dataclass(frozen=True)
class _Plan:
    steps_per_epoch: int | None  # None: a given dataset, run until it ends
    total_steps: int | None
    examples: int


def _plan(options: TrainOptions, source, given_dataset: bool) -> _Plan:
    examples = options.dataset_size or source.num_examples
    if options.dataset_size and options.dataset_size > source.num_examples:
        raise UsageError(f"--dataset-size: {options.dataset_size} is more than the {source.num_examples} examples "
                         f"of {source.path} (split {source.split!r})")
    batch = options.pipeline.batch_size
    if given_dataset and options.dataset_size is None:
        per_epoch = None
    elif options.pipeline.drop_remainder:
        per_epoch = examples // batch
    else:
        per_epoch = math.ceil(examples / batch)
    if per_epoch == 0:
        raise DataError(f"{source.path}: {examples} example(s) make no full batch of {batch}; "
                        "lower --batch-size or turn drop_remainder off")
    if options.repeats:
        return _Plan(per_epoch, options.steps, examples)
    return _Plan(per_epoch, None if per_epoch is None else per_epoch * options.epochs, examples)


def _open_validation(options: TrainOptions, labels: tuple[str, ...]):
    from stallscope.data.folders import DEFAULT_SPLIT
    from stallscope.pipeline.sources import available_splits, open_source

    path = options.validation_path
    if not path.is_dir():  # open_source would name --dataset-path, the training data's flag
        problem = "is not a directory" if path.exists() else "does not exist"
        raise UsageError(f"--validation-path: {str(path)!r} {problem}")
    splits = available_splits(options.source, path)
    if options.validation_split in splits:
        split = options.validation_split
    elif splits == (DEFAULT_SPLIT,) and path.resolve() != options.dataset_path.resolve():
        split = DEFAULT_SPLIT  # a plain {label}/* tree given as --validation-path: all of it validates
    else:
        raise UsageError(f"--validation-path: {str(path)!r} has no {options.validation_split!r} split; it has "
                         f"{', '.join(splits)} (training images must not validate the model)")
    source = open_source(options.source, path, split, options.labels_file)
    if tuple(source.labels) != tuple(labels):
        raise DataError(f"--validation-path: {path} has labels {list(source.labels)[:5]}... that differ from the "
                        f"training split's {list(labels)[:5]}...; give both the same --labels-file")
    return source


class _RealDevice:
    """The model's train step as a tf.function; reading the loss forces the step to complete.
    `last_correct` counts the batch's images the step's (training-mode) predictions got right."""

    def __init__(self, model, learning_rate: float) -> None:
        import keras
        import tensorflow as tf

        self.model = model
        self.optimizer = keras.optimizers.Adam(learning_rate)
        self.optimizer.build(model.trainable_variables)  # slots exist before a checkpoint restores them
        loss_fn = keras.losses.CategoricalCrossentropy()

        @tf.function
        def train_step(images, labels):
            with tf.GradientTape() as tape:
                predictions = model(images, training=True)
                loss = loss_fn(labels, predictions)
            gradients = tape.gradient(loss, model.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(predictions, axis=-1), tf.argmax(labels, axis=-1)),
                                            tf.int32))
            return loss, correct

        self._train_step = train_step
        self.last_correct = 0

    def run_step(self, batch) -> tuple[int, float]:
        images, labels = batch
        loss, correct = self._train_step(images, labels)
        self.last_correct = int(correct)
        return int(images.shape[0]), float(loss)


class _BatchNormKeeper:
    """Makes the moving statistics of the BatchNorm layers that train match the weights ("recalibrate")
    before the model is saved, validated or handed back; records what the run did with BatchNorm."""

    def __init__(self, options: TrainOptions, source, model, base) -> None:
        from stallscope.workload.batchnorm import batchnorm_layers, trained_batchnorm_layers

        self.options, self.source, self.model = options, source, model
        self.all_layers = batchnorm_layers(base) if base is not None else []
        self.trained = trained_batchnorm_layers(base) if base is not None else []
        self.mode = options.batchnorm_mode
        untrained = options.weights == "none" and self.mode == "recalibrate"
        self.still = [layer for layer in self.all_layers if not layer.trainable] if untrained else []
        self.prepared = 0
        self.default = options.batchnorm is None
        self.settled_step: int | None = None
        self.images = 0
        self.recalibrations = 0

    def prepare(self, start_step: int) -> None:
        """A fresh run from scratch: the frozen layers' statistics for their random weights, once."""
        if start_step == 0 and self.still:
            from stallscope.workload.batchnorm import recalibrate

            recalibrate(self.model, self.still, self._batches())
            self.prepared = len(self.still)

    def settle(self, step: int) -> None:
        if self.mode != "recalibrate" or not self.trained or self.settled_step == step:
            return
        from stallscope.workload.batchnorm import recalibrate

        self.images = recalibrate(self.model, self.trained, self._batches())
        self.recalibrations += 1
        self.settled_step = step

    def _batches(self):
        """Up to `recalibration_images` training images, shuffled (a batch of one class would skew the
        batch statistics the layers see), in batches of the training size, preprocessed as in training."""
        from stallscope.pipeline.builder import build_dataset
        from stallscope.workload.evaluate import evaluation_pipeline

        batch = self.options.pipeline.batch_size
        images = min(self.options.recalibration_images, self.source.num_examples)
        config = evaluation_pipeline(self.options.pipeline).replace(
            shuffle_buffer=self.source.num_examples, shuffle_at="encoded", drop_remainder=images >= batch,
            data_service="")  # read here: a service's workers would decode it for nothing
        return build_dataset(config, self.source, num_classes=self.source.num_classes).take(max(1, images // batch))

    def summary(self) -> dict[str, Any] | None:
        if self.model is None:
            return None
        return {"mode": self.mode, "default": self.default, "layers": len(self.all_layers),
                "trained_layers": len(self.trained), "frozen_layers_calibrated_at_start": self.prepared,
                "recalibrations": self.recalibrations,
                "recalibration_images": self.images if self.recalibrations else None}


def _for_source(options: TrainOptions, source) -> TrainOptions:
    """The pipeline as it reads this source on this CPU (`tuned` keeps more reads in flight on JPEGs in
    a store, and decodes on a pool of the quota's cores under a CPU quota)."""
    from stallscope.pipeline.presets import tuned_for_source

    pipeline = tuned_for_source(options.pipeline, source)
    if pipeline == options.pipeline:
        return options
    before = options.pipeline.to_dict()
    log.info("tuned for this source and CPU: %s", ", ".join(
        f"{name}={value}" for name, value in pipeline.to_dict().items() if before.get(name) != value))
    return dataclasses.replace(options, pipeline=pipeline)


def _service_watch(options: TrainOptions, on_silent: Callable[[str], None] | None):
    """A watch on each wait for a batch from the tf.data service, where the pipeline uses one: TF's
    client has no timeout, and a service with no worker, or one that stopped, sends nothing for ever."""
    if not options.pipeline.data_service:
        return None
    from stallscope.service.watchdog import ServiceWatch
    from stallscope.storage.stuck_calls import end_process

    return ServiceWatch(options.pipeline.data_service, options.data_service_timeout_s, on_silent or end_process)


@dataclasses.dataclass(frozen=True)
class _Device:
    """What runs the steps (the emulated device, or the model's train step) and the model parts a run
    reports, checkpoints and validates (None when emulated)."""

    runner: Any
    model: Any = None
    base: Any = None
    spec: ModelSpec | None = None
    optimizer: Any = None


def _make_device(options: TrainOptions, source) -> _Device:
    if options.accelerator.emulated:
        return _Device(EmulatedDevice(options.accelerator))
    from stallscope.workload.models import build_model

    if source.num_classes < 2:  # a softmax over one class: loss 0 and accuracy 1 from the first step, learning nothing
        raise DataError(f"--dataset-path: {str(source.path)!r} has one class ({source.labels[0]!r}); expected "
                        f"at least 2 class folders to fine-tune a classifier (an emulated accelerator runs on one)")
    spec = options.model_spec(source.labels)
    model, base = build_model(spec)
    runner = _RealDevice(model, options.learning_rate)
    return _Device(runner, model, base, spec, runner.optimizer)


def _open_checkpoints(options: TrainOptions, device: _Device):
    """(the checkpoint store or None, the global step it restored: 0 for a fresh run)."""
    if options.checkpoint_path is None:
        return None, 0
    from stallscope.workload.checkpoints import CheckpointStore

    store = CheckpointStore(options.checkpoint_path, model=device.model, optimizer=device.optimizer,
                            spec=device.spec, max_to_keep=options.max_checkpoints)
    return store, store.restore_latest()


class _Feed:
    """The run's batches: one repeating pipeline (by steps, or to a precision), or one per epoch. Each
    epoch's order depends only on the config's seed and the epoch, so a resumed run sees what an
    uninterrupted one would. Making an iterator of a tf.data service pipeline waits on the service,
    so it is made under `waiting`."""

    def __init__(self, options: TrainOptions, source, plan: _Plan, resume: _Resume, start_step: int,
                 dataset, waiting) -> None:
        self.options, self.source, self.plan, self.resume, self.start_step = options, source, plan, resume, start_step
        self.given = dataset is not None
        self.waiting = waiting
        self.epochs_started = 0
        self.first = dataset if dataset is not None else self.epoch_dataset(resume.epoch, resume.skip_examples)

    def epoch_dataset(self, epoch: int, skip_examples: int = 0):
        from stallscope.pipeline.builder import build_dataset

        options = self.options
        config = options.pipeline.replace(seed=options.pipeline.seed + epoch) if epoch else options.pipeline
        built = build_dataset(config, self.source, repeat=options.repeats, num_classes=self.source.num_classes,
                              skip_examples=skip_examples)
        if options.dataset_size and not options.repeats:
            built = built.take(self.plan.steps_per_epoch - skip_examples // options.pipeline.batch_size)
        return built

    def _iterator(self, dataset):
        self.epochs_started += 1
        with self.waiting():
            return iter(dataset)

    def iterators(self):
        """(iterator, steps to take from it or None: until it ends) chunks."""
        options, start_step = self.options, self.start_step
        if options.repeats:
            if options.steps is None:
                yield self._iterator(self.first), None
            elif options.steps > start_step:
                yield self._iterator(self.first), options.steps - start_step
            return
        if self.plan.steps_per_epoch is None:  # a given dataset: iterated once per epoch
            for _ in range(options.epochs):
                yield self._iterator(self.first), None
            return
        offset = start_step - self.resume.epoch * self.plan.steps_per_epoch
        for epoch in range(self.resume.epoch, options.epochs):
            fresh = epoch != self.resume.epoch and not self.given
            yield self._iterator(self.epoch_dataset(epoch) if fresh else self.first), self.plan.steps_per_epoch - offset
            offset = 0


def _describe_chains(dataset) -> dict[str, list[str]]:
    """The pipeline as written and as TF runs it (after its static rewrites)."""
    import tensorflow as tf

    from stallscope.pipeline.describe import pipeline_as_built, pipeline_as_run

    try:
        return {"written": pipeline_as_built(dataset), "ran": pipeline_as_run(dataset)}
    except (ValueError, tf.errors.OpError) as exc:  # a hand-made dataset the describer cannot read
        log.warning("could not describe the pipeline as run: %s", exc)
        return {"written": [], "ran": []}


def _next_batch(iterator, source):
    """The next batch, or None where the data ended; a failure of the data or the store is one line."""
    import tensorflow as tf

    try:
        return next(iterator)
    except StopIteration:
        return None
    except data_errors() as exc:
        raise input_error(source, exc) from None  # names the shard or image
    except store_errors() as exc:  # TF's gs:// gave up on the store
        raise store_error(source, exc) from None
    except tf.errors.UnknownError as exc:
        from stallscope.storage.tfdata_readers import storage_failure
        if storage_failure(exc) is None:
            raise
        # The store failed mid-run: one line. Not kept in a local (see the function).
        raise storage_failure(exc) from None


class _StepLoop:
    """Runs steps until the plan, the precision target or the data ends, timing each step and counting
    its I/O; saves checkpoints on the way; keeps what it measured when interrupted."""

    def __init__(self, options: TrainOptions, source, plan: _Plan, device: _Device, feed: _Feed, store,
                 start_step: int, batchnorm: _BatchNormKeeper, run_dir: Path, on_step, service_watch) -> None:
        import tensorflow as tf

        self.options, self.source, self.plan, self.device, self.feed = options, source, plan, device, feed
        self.store, self.batchnorm, self.on_step, self.service_watch = store, batchnorm, on_step, service_watch
        self.profiler = StepProfiler(options.profile_steps, run_dir)
        self.writer = tf.summary.create_file_writer(str(run_dir / "train"))
        self.phase = "train" if options.accelerator.emulated else options.fine_tune
        self.clock = StepClock()
        self.served = served_counters_for(str(source.path))
        self.served_at_begin = self.served_at_end = None
        self.io = StepIoCounter(store=self.served.counts if self.served is not None else None)
        self.monitor = ResourceMonitor()
        self.steps: list[rundir.StepRecord] = []
        self.window: list[rundir.StepRecord] = []
        self.losses: list[float] = []
        self.accuracies: list[float] = []
        self.step = self.last_saved = start_step
        self.interrupted = False
        self.stopped_by = "steps" if options.steps is not None else "epochs"
        self.started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")

    def run(self) -> None:
        self.served_at_begin = self.served.read() if self.served is not None else None
        self.io.begin()
        with self.monitor, self.writer.as_default():
            try:
                if self.service_watch is not None:
                    self.service_watch.start()
                self._run_iterators()
            except KeyboardInterrupt:
                self.interrupted = True  # keep what was measured; re-raised once the run directory is written
                self.stopped_by = "interrupted"
            finally:
                if self.service_watch is not None:
                    self.service_watch.stop()
                self.profiler.stop()
                if self.store is not None and self.step != self.last_saved:
                    self.batchnorm.settle(self.step)
                    self.store.save()
                self.writer.flush()
        self.io.end()  # after the iterators are gone: read-ahead abandoned at the end is counted
        self.served_at_end = self.served.read() if self.served is not None else None
        self.steps = self.io.annotate(self.steps)

    def _run_iterators(self) -> None:
        for iterator, count in self.feed.iterators():
            taken = 0
            while count is None or taken < count:
                if not self._one_step(iterator):
                    if self.options.precision is not None and self.options.steps is None:
                        self.stopped_by = "data_end"
                    break
                taken += 1
                if self._precision_met():
                    return
            del iterator  # its read-ahead stops before the next epoch's, and before the run's final count

    def _precision_met(self) -> bool:
        target = self.options.precision
        if target is None or self.options.steps is not None:
            return False
        count = len(self.steps)
        if count % max(1, count // 100):  # a look every 1% of the steps so far: the check stays cheap
            return False
        met = target_met(self.steps, target)
        if met is not None:
            self.stopped_by = met
        return met is not None

    def _one_step(self, iterator) -> bool:
        """One step; False where the data ended before it."""
        import tensorflow as tf

        current = self.step + 1
        with self.profiler.step(current):
            self.clock.start()
            self.io.start()
            with self.feed.waiting():
                batch = _next_batch(iterator, self.source)
            if batch is None:
                return False
            self.clock.batch_received()
            if self.options.accelerator.emulated:
                with tf.profiler.experimental.Trace(TRACE_NAME):
                    images = self.device.runner.run_step(batch)
                loss = None
            else:
                images, loss = self.device.runner.run_step(batch)
            self.clock.step_done()
            self.io.stop()
        self.step = current
        self._after_step(images, loss)
        return True

    def _after_step(self, images: int, loss: float | None) -> None:
        """Records the step; logs, writes scalars, reports progress and checkpoints when due."""
        import tensorflow as tf

        step, options = self.step, self.options
        if self.store is not None:
            self.store.step.assign(step)
        record = self.clock.record(step=step, phase=self.phase, images=images,
                                   warmup=len(self.steps) < options.warmup_steps)
        self.steps.append(record)
        self.window.append(record)
        if loss is not None:
            self.losses.append(loss)
            self.accuracies.append(self.device.runner.last_correct / images if images else 0.0)
        line = None
        if step % options.log_every == 0:
            line = format_step_line(step, self.window, loss)
            _write_scalars(tf, step, self.window, loss)
            log.info("%s", line)
            self.window = []
        if self.on_step is not None:
            self.on_step(StepProgress(record, loss, self.plan.total_steps, line))
        if self.store is not None and step % options.checkpoint_every == 0:
            self.batchnorm.settle(step)
            self.store.save()
            self.last_saved = step


def _validate(options: TrainOptions, model, validation_source, source, writer, step: int) -> dict[str, Any] | None:
    """Top-1, top-5 and loss on the held-out data, also written as TensorBoard scalars."""
    import tensorflow as tf

    from stallscope.pipeline.builder import build_dataset
    from stallscope.workload.evaluate import evaluate_model, evaluation_pipeline

    eval_config = evaluation_pipeline(options.pipeline)
    eval_dataset = build_dataset(eval_config, validation_source, num_classes=source.num_classes)
    validation = evaluate_model(model, eval_dataset, validation_source).to_dict()
    with writer.as_default():
        for name in ("top1", "top5", "loss"):
            tf.summary.scalar(f"validation/{name}", validation[name], step=step)
    writer.flush()
    return validation


def run_training(options: TrainOptions, *, dataset=None, source=None,
                 on_step: Callable[[StepProgress], None] | None = None,
                 on_service_silent: Callable[[str], None] | None = None) -> TrainResult:
    """Trains (or emulates training) as `options` say; writes the run directory; returns the figures.
    `on_service_silent(message)`: where the tf.data service sends no batch for the options' timeout;
    it must end the process (by default: the line, exit code 2), as the waiting thread cannot stop."""
    from stallscope.tfimport import import_tensorflow

    import_tensorflow()
    import keras

    from stallscope.pipeline.sources import open_source

    if source is None:
        source = open_source(options.source, options.dataset_path, options.split, options.labels_file)
    options = _for_source(options, source)
    validation_source = _open_validation(options, source.labels) if options.validation_path else None
    plan = _plan(options, source, dataset is not None)
    run_dir, made = _make_run_dir(options)
    loop = None
    written_when_silent: list[Callable[[], None]] = []  # set once the run has steps to write

    def service_silent(message: str) -> None:
        """The service stopped sending batches: what was measured is written, marked interrupted,
        before the process ends (the thread waiting in TF cannot be stopped)."""
        for write in written_when_silent:
            try:
                write()
            except Exception:  # noqa: BLE001 - the service's line is the one to give
                log.warning("could not write the run directory before ending", exc_info=True)
        (on_service_silent or _end_process)(message)

    try:
        keras.utils.set_random_seed(options.seed)
        device = _make_device(options, source)
        store, start_step = _open_checkpoints(options, device)
        resume = _resume_position(options, plan, start_step, given_dataset=dataset is not None)
        service_watch = _service_watch(options, service_silent if options.pipeline.data_service else None)
        waiting = service_watch.waiting if service_watch is not None else contextlib.nullcontext
        feed = _Feed(options, source, plan, resume, start_step, dataset, waiting)
        chains = _describe_chains(feed.first)
        batchnorm = _BatchNormKeeper(options, source, device.model, device.base)
        batchnorm.prepare(start_step)
        if start_step and plan.total_steps is not None and start_step >= plan.total_steps:
            log.info("checkpoint at step %d already reaches the %d steps asked for", start_step, plan.total_steps)

        cold = start_cold(options.dataset_path, source.files) if options.cold else None
        loop = _StepLoop(options, source, plan, device, feed, store, start_step, batchnorm, run_dir, on_step,
                         service_watch)
        read_before = request_tally.snapshot()

        def complete_summary(steps: list[rundir.StepRecord], validation: dict[str, Any] | None) -> dict[str, Any]:
            summary = _summary(options, source, plan, summarize_steps(steps), loop, chains, run_dir, start_step,
                               store, validation, device)
            summary["store_requests"] = store_requests(request_tally.snapshot().since(read_before), source,
                                                       images=sum(s.images for s in steps))
            summary["batchnorm"] = batchnorm.summary()
            summary["cold"] = cold.to_dict() if cold is not None else None
            summary["train_top1_last_10"] = (sum(loop.accuracies[-10:]) / len(loop.accuracies[-10:])
                                             if loop.accuracies else None)
            summary["interrupted"] = loop.interrupted
            summary["split_coverage"] = split_coverage(options, plan, steps, start_step, interrupted=loop.interrupted)
            summary["resumed_data"] = (None if start_step == 0 else {"epoch": resume.epoch, "skipped_examples":
                                       resume.skip_examples, "exact": resume.exact})
            return summary

        def write_when_silent() -> None:
            steps = list(loop.steps)
            if steps:
                loop.interrupted, loop.stopped_by = True, "interrupted"
                summary = complete_summary(steps, None)
                summary["stopped_by"] = "the tf.data service sent no batch within --data-service-timeout"
                _write_run_dir(run_dir, options, steps, chains, loop.monitor, summary)

        written_when_silent.append(write_when_silent)
        loop.run()
    except BaseException:
        with contextlib.suppress(Exception):  # the run's own error is the one to report, not the clean-up's
            _remove_run_without_steps(run_dir, made, loop)
        raise
    written_when_silent.clear()
    if not loop.interrupted:
        batchnorm.settle(loop.step)  # the model handed back (and validated) infers as it was trained
    validation = None
    if validation_source is not None and not loop.interrupted:
        validation = _validate(options, device.model, validation_source, source, loop.writer, loop.step)

    steps = loop.steps
    stats = summarize_steps(steps)
    summary = complete_summary(steps, validation)
    if steps or not (run_dir / rundir.SUMMARY_NAME).exists():  # a no-op resume keeps the last run's figures
        _write_run_dir(run_dir, options, steps, chains, loop.monitor, summary)
    if loop.interrupted:
        raise KeyboardInterrupt
    return TrainResult(steps=steps, summary=summary, run_dir=run_dir, stats=stats, model=device.model)


def _end_process(message: str) -> None:
    from stallscope.storage.stuck_calls import end_process

    end_process(message)


PARTIAL_BATCHES = {
    "service": "each tf.data service worker batches its own share of the images and drops its last partial batch",
    "local": "the last partial batch of each epoch is dropped (drop_remainder)",
}


def split_coverage(options: TrainOptions, plan: _Plan, steps: list[rundir.StepRecord], start_step: int, *,
                   interrupted: bool) -> dict[str, Any]:
    """The images the steps took against those in the split for the epochs asked, and how many were
    dropped as partial batches; in_split and dropped None where nothing is set against (a run by steps
    or to a precision repeats the data; a resumed or interrupted run trained only part of it)."""
    trained = sum(s.images for s in steps)
    whole_run = not options.repeats and plan.steps_per_epoch is not None and start_step == 0 and not interrupted
    if not whole_run:
        return {"images_trained": trained, "images_in_split": None, "dropped": None, "why_dropped": None}
    in_split = plan.examples * options.epochs
    dropped = max(0, in_split - trained)
    why = (PARTIAL_BATCHES["service" if options.pipeline.data_service else "local"] if dropped else None)
    return {"images_trained": trained, "images_in_split": in_split, "dropped": dropped, "why_dropped": why}


def _write_scalars(tf, step: int, window: list[rundir.StepRecord], loss: float | None) -> None:
    count = max(1, len(window))
    step_s = sum(r.step_ms for r in window) / count / 1000.0
    images = sum(r.images for r in window) / count
    tf.summary.scalar("examples_per_sec", images / step_s if step_s > 0 else 0.0, step=step)
    tf.summary.scalar("input_wait_ms", sum(r.input_wait_ms for r in window) / count, step=step)
    tf.summary.scalar("step_time_ms", step_s * 1000.0, step=step)
    if loss is not None:
        tf.summary.scalar("loss", loss, step=step)


def _model_summary(spec: ModelSpec | None, model) -> dict[str, Any] | None:
    if spec is None:
        return None
    data = spec.to_dict()
    data.pop("labels")
    data["parameters"] = int(model.count_params())
    data["trainable_parameters"] = int(sum(int(v.numpy().size) for v in model.trainable_variables))
    return data


@dataclasses.dataclass(frozen=True)
class _Resume:
    """Where a (resumed) run's data starts: the epoch, and the examples of it already trained on
    that the pipeline skips before decoding (0 where its order cannot be reproduced that way)."""

    epoch: int
    skip_examples: int
    exact: bool


def _resume_position(options: TrainOptions, plan: _Plan, start_step: int, *, given_dataset: bool) -> _Resume:
    from stallscope.pipeline.builder import unresumable_reason

    if start_step == 0:
        return _Resume(0, 0, True)
    if options.steps is not None or plan.steps_per_epoch is None:
        epoch, offset = 0, start_step
    else:
        epoch, offset = divmod(start_step, plan.steps_per_epoch)
    why = "the dataset was given ready-made" if given_dataset else unresumable_reason(options.pipeline)
    if why is None:
        return _Resume(epoch, offset * options.pipeline.batch_size, True)
    log.info("resuming at step %d: the data of epoch %d starts again from its beginning, because %s",
             start_step, epoch, why)
    return _Resume(epoch, 0, False)


PER_IMAGE = ("per image trained: what was fetched from the run's start to its pipeline's end (warm-up, and "
             "read-ahead abandoned at the end, included) over the images its steps took")


def store_requests(made: RequestTally, source, *, images: int) -> dict[str, Any] | None:
    """What stallscope's reader asked the store for during the run (training and validation): requests,
    bytes, requests per image trained (PER_IMAGE), and a request's median and 90th-percentile time as
    the reader saw it; None where it made none (local data, TF's own gs:// client)."""
    if made.requests == 0:
        return None
    return {**made.to_dict(), "requests_per_image": made.requests / images if images else None}


def fetched(loop: "_StepLoop", source, images: int) -> dict[str, Any] | None:
    """What the run fetched, on its I/O basis (step_io.py), per image trained (PER_IMAGE), and its read
    amplification: bytes fetched per byte of the images trained (1.0: each trained image's bytes once;
    more: read-ahead, re-reads, blocks larger than an image)."""
    totals, basis = loop.io.run_totals(), loop.io.basis()
    if totals is None or images <= 0:
        return None
    requests, fetched_bytes = totals
    image_bytes = source.total_bytes / source.num_examples if source.num_examples else 0.0
    trained_bytes = images * image_bytes
    return {"basis": basis, "meaning": BASIS_MEANING[basis], "requests": requests, "bytes": fetched_bytes,
            "images_trained": images, "requests_per_image": requests / images,
            "bytes_per_image": fetched_bytes / images, "bytes_trained": trained_bytes,
            "read_amplification": fetched_bytes / trained_bytes if trained_bytes > 0 else None,
            "per_image": PER_IMAGE}


def store_latency(loop: "_StepLoop") -> dict[str, Any] | None:
    """The requests' time at the emulated store the data is on, whichever client made them (p50, p90,
    p99 and the histogram); None where the data is not on one."""
    if loop.served is None or loop.served_at_begin is None or loop.served_at_end is None:
        return None
    return loop.served.latency(loop.served_at_begin, loop.served_at_end)


def _summary(options, source, plan, stats, loop: "_StepLoop", chains, run_dir, start_step, store, validation,
             device: "_Device") -> dict[str, Any]:
    import tensorflow as tf

    steps, losses, monitor, profiler = loop.steps, loop.losses, loop.monitor, loop.profiler
    report = monitor.report
    images = sum(s.images for s in steps)
    io = dict(report.io) if report and report.io is not None else None
    per = per_image(io, images, source_kind=source.kind, files_in_source=len(source.files),
                    examples=source.num_examples)
    if per is not None:
        io["files_opened"] = round(per.files_opened * per.images)
        io["per_image"] = per.to_dict()
    from stallscope.pipeline.presets import overridden_fields
    from stallscope.storage.tfdata_readers import describe_reader

    summary = {
        **stats.to_dict(),
        "measured_steps": stats.steps - stats.warmup_steps,
        "first_step": steps[0].step if steps else None,
        "last_step": steps[-1].step if steps else start_step,
        "resumed_from_step": start_step,
        "total_steps": plan.total_steps,
        "epochs": options.epochs if not options.repeats else None,
        "epochs_started": loop.feed.epochs_started,
        "batch_size": options.pipeline.batch_size,
        "image_size": options.pipeline.image_size,
        "final_loss": losses[-1] if losses else None,
        "mean_loss_last_10": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
        "pipeline": {
            "preset": options.pipeline.preset,
            "requested": options.pipeline.to_dict(),
            "overrides": json_ready(overridden_fields(options.pipeline)),
            **chains,
        },
        "model": _model_summary(device.spec, device.model),
        "source": {"kind": source.kind, "path": str(source.path), "split": source.split,
                   "examples": source.num_examples, "files": len(source.files), "bytes": source.total_bytes,
                   "schema": source.schema, "classes": source.num_classes,
                   "reader": describe_reader(source.kind, source.files, read_parallelism=options.pipeline.read_parallelism,
                                             map_parallelism=options.pipeline.map_parallelism,
                                             private_pool=options.pipeline.private_threadpool_size,
                                             gcs_reader=options.pipeline.gcs_reader),
                   "storage": storage_under(source.path).to_dict()},
        "accelerator": options.accelerator.to_dict(),
        "dataset_path": str(options.dataset_path),
        "dataset_size": plan.examples,
        "learning_rate": options.learning_rate,
        "cpu": report.summary() if report else None,
        "io": io,
        "precision": measure_precision(steps, target=options.precision, stopped_by=loop.stopped_by).to_dict(),
        "step_io": {"basis": loop.io.basis(), "meaning": BASIS_MEANING.get(loop.io.basis())},
        "fetched": fetched(loop, source, images),
        "store_latency": store_latency(loop),
        "profile": {"steps": options.profile_steps.text, "captured_steps": profiler.captured_steps,
                    "files": [str(p.relative_to(run_dir)) for p in rundir.profile_files(run_dir)]}
        if options.profile_steps else None,
        "checkpoint": {"path": str(store.directory), "latest": store.latest} if store else None,
        "validation": validation,
        "run_dir": str(run_dir),
        "started_at": loop.started_at,
        "wall_time_s": report.duration_s if report else None,
        "stallscope_version": __version__,
        "tensorflow_version": tf.__version__,
        "python_version": platform.python_version(),
    }
    return json_ready(summary)


def _write_run_dir(run_dir: Path, options: TrainOptions, steps, chains, monitor, summary) -> None:
    rundir.write_steps(run_dir, steps)
    rundir.write_json(run_dir, rundir.PIPELINE_NAME, {
        "requested": options.pipeline.to_dict(), **chains, "preset": options.pipeline.preset,
        "overrides": summary["pipeline"]["overrides"],
    })
    rundir.write_json(run_dir, rundir.RESOURCES_NAME, monitor.report.to_dict() if monitor.report else {})
    rundir.write_json(run_dir, rundir.SUMMARY_NAME, summary)
