"""A user's own custom training loop: a `tf.function` step, no step markers, profiled with
`tf.profiler.experimental.start/stop` around steps 5..12.

Usage: custom_loop.py LOG_DIR TIMES_JSON [stalled|healthy|tensors]
`tensors` feeds batches held in a Python list, so no tf.data iterator runs inside the profile.
Writes the wall-clock time of each profiled step (next(iterator) plus the step call) to TIMES_JSON.
"""

import json
import sys
import time

import tensorflow as tf

from keras_fit import BATCH, PROFILE, STEPS, dataset


def main():
    log_dir, times_json = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) > 3 else "healthy"
    model = tf.keras.Sequential([
        tf.keras.Input((16, 16, 3)), tf.keras.layers.Conv2D(128, 3, activation="relu"),
        tf.keras.layers.Conv2D(128, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(4),
    ])
    optimizer = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    times = []
    iterator = iter(list(dataset("healthy"))) if kind == "tensors" else iter(dataset(kind))
    for step in range(STEPS):
        if step == PROFILE[0]:
            tf.profiler.experimental.start(log_dir)
        started = time.perf_counter()
        x, y = next(iterator)
        train_step(x, y).numpy()
        times.append({"batch": step, "ms": (time.perf_counter() - started) * 1e3})
        if step == PROFILE[1]:
            tf.profiler.experimental.stop()
    with open(times_json, "w") as out:
        json.dump({"profile_batch": PROFILE, "steps_per_execution": 1, "batches": times}, out)


if __name__ == "__main__":
    main()
