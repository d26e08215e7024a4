"""A user's own Keras `fit` script, profiled with the TensorBoard callback (no step markers).

Usage: keras_fit.py LOG_DIR TIMES_JSON [stalled|healthy|numpy] [STEPS_PER_EXECUTION] [--validate] [--profiler]
`numpy` passes arrays to fit (Keras 3 still wraps them in a tf.data pipeline of its own).
Writes the wall-clock time of every call of the train function (from on_train_batch_begin/end; one
batch, or STEPS_PER_EXECUTION batches) to TIMES_JSON, keyed by the number of the call's first batch
counted over all epochs, so a test can compare what stallscope finds in the profile with the
program's own timing. `--profiler` profiles with tf.profiler.experimental.start/stop in a callback
instead of the TensorBoard callback (so no 'Profiled batch' spans). `--validate` runs two epochs
with a validation phase between them, inside the profiled window.
"""

import argparse
import contextlib
import json
import time

import numpy as np
import tensorflow as tf

STEPS, BATCH, PROFILE = 20, 8, (5, 12)
SCOPE = contextlib.nullcontext   # keras_mirrored.py builds the model under a distribution strategy


def slow_decode(x):
    def work(value):
        # 160 ms of input per batch, sequential: over half of a step while the model's step (CPU work,
        # growing with the machine's load) stays under 160 ms. With a busy loop beside others' tests on
        # 2 cores the model's step took 25-51 ms: against 80 ms of input that left a share of 0.61 at
        # worst, close to the 0.5 a test asks of the stalled run; against 160 ms, 0.76
        time.sleep(0.020)
        return value

    image = tf.numpy_function(work, [x], tf.float32, stateful=False)
    return tf.ensure_shape(image, (16, 16, 3))


def dataset(kind, steps=STEPS):
    images = np.random.default_rng(0).random((steps * BATCH, 16, 16, 3), dtype=np.float32)
    labels = np.arange(steps * BATCH) % 4
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    if kind == "stalled":
        ds = ds.map(lambda x, y: (slow_decode(x), y)).batch(BATCH)
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_and_batch_fusion = False
        return ds.with_options(options)
    return ds.cache().batch(BATCH).prefetch(4)


class BatchTimes(tf.keras.callbacks.Callback):
    def __init__(self, per_call):
        super().__init__()
        self.per_call, self.times = per_call, []

    def on_train_batch_begin(self, batch, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        first = len(self.times) * self.per_call
        self.times.append({"batch": first, "ms": (time.perf_counter() - self.started) * 1e3})


class ProfilerWindow(tf.keras.callbacks.Callback):
    """`tf.profiler.experimental.start/stop` around calls PROFILE[0]..PROFILE[1]: no Keras spans."""

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir, self.calls = log_dir, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.calls == PROFILE[0]:
            tf.profiler.experimental.start(self.log_dir)

    def on_train_batch_end(self, batch, logs=None):
        if self.calls == PROFILE[1]:
            tf.profiler.experimental.stop()
        self.calls += 1


def build_model(per_call):
    model = tf.keras.Sequential([
        tf.keras.Input((16, 16, 3)), tf.keras.layers.Conv2D(128, 3, activation="relu"),
        tf.keras.layers.Conv2D(128, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(4, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy", steps_per_execution=per_call)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log_dir")
    parser.add_argument("times_json")
    parser.add_argument("kind", nargs="?", default="healthy", choices=["stalled", "healthy", "numpy"])
    parser.add_argument("steps_per_execution", nargs="?", type=int, default=1)
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--profiler", action="store_true")
    args = parser.parse_args()
    log_dir, times_json, kind, per_call = args.log_dir, args.times_json, args.kind, args.steps_per_execution
    epochs, steps = (2, STEPS // 2) if args.validate else (1, STEPS * per_call)
    with SCOPE():
        model = build_model(per_call)
    timer = BatchTimes(per_call)
    if args.profiler:
        board = ProfilerWindow(log_dir)
    else:
        board = tf.keras.callbacks.TensorBoard(log_dir=log_dir, profile_batch=PROFILE)
    if kind == "numpy":
        rng = np.random.default_rng(0)
        x = rng.random((steps * BATCH, 16, 16, 3), dtype=np.float32)
        model.fit(x, np.arange(steps * BATCH) % 4, batch_size=BATCH, epochs=epochs, verbose=0,
                  callbacks=[timer, board])
    else:
        validation = dataset(kind, steps=4) if args.validate else None
        model.fit(dataset(kind, steps), epochs=epochs, verbose=0, callbacks=[timer, board],
                  validation_data=validation)
    with open(times_json, "w") as out:
        json.dump({"profile_batch": PROFILE, "steps_per_execution": per_call, "batches": timer.times}, out)


if __name__ == "__main__":
    main()
