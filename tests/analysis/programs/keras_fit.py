"""A user's own Keras `fit` script, profiled with the TensorBoard callback (no step markers).

Usage: keras_fit.py LOG_DIR TIMES_JSON [stalled|healthy|numpy]
`numpy` passes arrays to fit (Keras 3 still wraps them in a tf.data pipeline of its own). [STEPS_PER_EXECUTION]
Writes the wall-clock time of every call of the train function (from on_train_batch_begin/end; one
batch, or STEPS_PER_EXECUTION batches) to TIMES_JSON, keyed by the number of the call's first batch
counted over all epochs, so a test can compare what stallscope finds in the profile with the
program's own timing. `validate` runs two epochs with a validation phase between them, inside the
profiled window.
"""

import contextlib
import json
import sys
import time

import numpy as np
import tensorflow as tf

STEPS, BATCH, PROFILE = 20, 8, (5, 12)
SCOPE = contextlib.nullcontext   # keras_mirrored.py builds the model under a distribution strategy


def slow_decode(x):
    def work(value):
        time.sleep(0.004)
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


def build_model(per_call):
    model = tf.keras.Sequential([
        tf.keras.Input((16, 16, 3)), tf.keras.layers.Conv2D(128, 3, activation="relu"),
        tf.keras.layers.Conv2D(128, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(4, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy", steps_per_execution=per_call)
    return model


def main():
    log_dir, times_json = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) > 3 else "healthy"
    per_call = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    validate = len(sys.argv) > 5 and sys.argv[5] == "validate"
    epochs, steps = (2, STEPS // 2) if validate else (1, STEPS * per_call)
    with SCOPE():
        model = build_model(per_call)
    timer = BatchTimes(per_call)
    board = tf.keras.callbacks.TensorBoard(log_dir=log_dir, profile_batch=PROFILE)
    if kind == "numpy":
        rng = np.random.default_rng(0)
        x = rng.random((steps * BATCH, 16, 16, 3), dtype=np.float32)
        model.fit(x, np.arange(steps * BATCH) % 4, batch_size=BATCH, epochs=epochs, verbose=0,
                  callbacks=[timer, board])
    else:
        validation = dataset(kind, steps=4) if validate else None
        model.fit(dataset(kind, steps), epochs=epochs, verbose=0, callbacks=[timer, board],
                  validation_data=validation)
    with open(times_json, "w") as out:
        json.dump({"profile_batch": PROFILE, "steps_per_execution": per_call, "batches": timer.times}, out)


if __name__ == "__main__":
    main()
