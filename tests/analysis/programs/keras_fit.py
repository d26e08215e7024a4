"""A user's own Keras `fit` script, profiled with the TensorBoard callback (no step markers).

Usage: keras_fit.py LOG_DIR TIMES_JSON [stalled|healthy|numpy]
`numpy` passes arrays to fit (Keras 3 still wraps them in a tf.data pipeline of its own). [STEPS_PER_EXECUTION]
Writes the wall-clock time of every training batch (from on_train_batch_begin/end) to TIMES_JSON,
so a test can compare what stallscope finds in the profile with the program's own timing.
"""

import json
import sys
import time

import numpy as np
import tensorflow as tf

STEPS, BATCH, PROFILE = 20, 8, (5, 12)


def slow_decode(x):
    def work(value):
        time.sleep(0.004)
        return value

    image = tf.numpy_function(work, [x], tf.float32, stateful=False)
    return tf.ensure_shape(image, (16, 16, 3))


def dataset(kind):
    images = np.random.default_rng(0).random((STEPS * BATCH, 16, 16, 3), dtype=np.float32)
    labels = np.arange(STEPS * BATCH) % 4
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
    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append({"batch": batch, "ms": (time.perf_counter() - self.started) * 1e3})


def main():
    log_dir, times_json = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) > 3 else "healthy"
    per_call = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    model = tf.keras.Sequential([
        tf.keras.Input((16, 16, 3)), tf.keras.layers.Conv2D(128, 3, activation="relu"),
        tf.keras.layers.Conv2D(128, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(4, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy", steps_per_execution=per_call)
    timer = BatchTimes()
    board = tf.keras.callbacks.TensorBoard(log_dir=log_dir, profile_batch=PROFILE)
    if kind == "numpy":
        rng = np.random.default_rng(0)
        x = rng.random((STEPS * BATCH, 16, 16, 3), dtype=np.float32)
        model.fit(x, np.arange(STEPS * BATCH) % 4, batch_size=BATCH, epochs=1, verbose=0, callbacks=[timer, board])
    else:
        model.fit(dataset(kind), epochs=1, verbose=0, callbacks=[timer, board])
    with open(times_json, "w") as out:
        json.dump({"profile_batch": PROFILE, "steps_per_execution": per_call, "batches": timer.times}, out)


if __name__ == "__main__":
    main()
