"""Stepping through a user's dataset the way Keras' `fit` does, so a probe measures what `fit` meets.

`fit` iterates the dataset as given, one new iterator per epoch (no `repeat`: TF injects a prefetch
above a repeat, which `fit` never runs), and under `steps_per_execution=N` one call of its train
function fetches and trains N batches inside one graph. A step here is one such call: its input wait
is the time inside the iterator's fetches, taken in the graph with `tf.timestamp` around each one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from stallscope.errors import UsageError
from stallscope.workload.accelerator import batch_examples


@dataclasses.dataclass(frozen=True)
class Taken:
    """What one step took from the iterator: batches (0: the epoch had ended), their examples, and
    the seconds spent waiting in the iterator's fetches."""

    batches: int
    images: int
    wait_s: float


StepFn = Callable[[Any], Taken]  # runs one step on an iterator of the dataset


def steps_per_execution(model) -> int:
    """Batches one call of Keras' train function runs (compile's steps_per_execution); 1 when unknown."""
    value = getattr(model, "steps_per_execution", 1)
    try:
        return max(int(value), 1)
    except (TypeError, ValueError):
        return 1


def epochs(dataset) -> Iterator[Any]:
    """The dataset's elements epoch after epoch, each epoch from a new iterator as `fit` makes one;
    UsageError where an epoch holds nothing (a loop over it would never end)."""
    while True:
        got = 0
        for element in dataset:
            got += 1
            yield element
        if not got:
            raise UsageError("dataset: an epoch of it holds no batch; there is nothing to measure")


def eager_steps(run_step: Callable[[Any], Any]) -> StepFn:
    """One batch a step: `next(iterator)` timed from Python, then `run_step(batch)` (an emulated device),
    which returns only when the step is done."""

    def step(iterator) -> Taken:
        began = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            return Taken(0, 0, 0.0)
        waited = time.perf_counter() - began
        run_step(batch)
        return Taken(1, batch_examples(batch), waited)

    return step


def model_strategy(model):
    """The tf.distribute strategy the model was built under (a MirroredStrategy's scope, ...); None for
    TF's default, where no strategy was asked for."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or type(strategy).__name__ == "_DefaultDistributionStrategy":
        return None
    return strategy


def fed_to(model) -> Callable[[Any], Any]:
    """What the loop iterates for `model`: the dataset as given, or under a strategy its distributed
    dataset (each replica its share of each batch), as `fit` and a custom loop under the strategy do."""
    strategy = model_strategy(model)
    if strategy is None:
        return lambda dataset: dataset
    return strategy.experimental_distribute_dataset


def model_steps(model) -> StepFn:
    """The model's own `train_step` on up to `steps_per_execution` batches fetched inside one graph, as
    `fit`'s train function runs them; each fetch is timed by `tf.timestamp` in the graph, ordered
    against the steps around it by control dependencies. Under a strategy the step runs on every replica
    (`strategy.run`, in its scope), on an iterator of the distributed dataset (`fed_to`)."""
    import tensorflow as tf

    per_step = steps_per_execution(model)
    strategy = model_strategy(model)
    if strategy is None:
        train_step = model.train_step
    else:
        def train_step(batch):
            return strategy.run(model.train_step, args=(batch,))

    def examples(batch):
        parts = tf.nest.flatten(batch)
        if strategy is not None:  # a replica's share each: the batch is their sum
            shares = strategy.experimental_local_results(parts[0])
            return tf.cast(tf.add_n([tf.shape(share)[0] for share in shares]), tf.int64)
        for part in parts:
            if part.shape.rank:
                return tf.cast(tf.shape(part)[0], tf.int64)
        return tf.constant(1, tf.int64)

    @tf.function(reduce_retracing=True)
    def execute(iterator):
        batches = tf.constant(0, tf.int64)
        images = tf.constant(0, tf.int64)
        wait = tf.constant(0.0, tf.float64)
        for _ in tf.range(per_step):
            with tf.control_dependencies([batches]):
                began = tf.timestamp()
            with tf.control_dependencies([began]):
                optional = iterator.get_next_as_optional()
            has = optional.has_value()
            with tf.control_dependencies([has]):
                wait += tf.timestamp() - began
            if not has:
                break
            batch = optional.get_value()
            logs = train_step(batch)
            with tf.control_dependencies(tf.nest.flatten(logs)):
                batches += 1
            images += examples(batch)
        return batches, images, wait

    def step(iterator) -> Taken:
        if strategy is None:
            batches, images, wait = execute(iterator)
        else:
            with strategy.scope():
                batches, images, wait = execute(iterator)
        return Taken(int(batches), int(images), float(wait))  # .numpy(): waits for the steps to finish

    return step
