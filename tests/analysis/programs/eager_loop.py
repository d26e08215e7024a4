"""A user's own eager training loop (no tf.function, no step markers), profiled around steps 5..12.

Usage: eager_loop.py LOG_DIR TIMES_JSON [stalled|healthy]
Writes the wall-clock time of each step (next(iterator) plus the eager update) to TIMES_JSON.
Each step ends in DEVICE_S of an emulated device's wait (no CPU): the update alone is a matmul of well
under a millisecond, beside which the few ms a loaded machine makes a get_next wait for a core read the
healthy loop as highly input-bound.
"""

import json
import sys
import time

import tensorflow as tf

from keras_fit import PROFILE, STEPS, dataset

DEVICE_S = 0.1   # the stalled input takes 160 ms a batch, over half of such a step; the healthy one a few %


def main():
    log_dir, times_json = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) > 3 else "healthy"
    kernel = tf.Variable(tf.random.normal((16 * 16 * 3, 4)))
    times = []
    iterator = iter(dataset(kind))
    for step in range(STEPS):
        if step == PROFILE[0]:
            tf.profiler.experimental.start(log_dir)
        started = time.perf_counter()
        x, y = next(iterator)
        with tf.GradientTape() as tape:
            logits = tf.matmul(tf.reshape(x, (-1, 16 * 16 * 3)), kernel)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        kernel.assign_sub(0.01 * tape.gradient(loss, kernel))
        time.sleep(DEVICE_S)
        times.append({"batch": step, "ms": (time.perf_counter() - started) * 1e3})
        if step == PROFILE[1]:
            tf.profiler.experimental.stop()
    with open(times_json, "w") as out:
        json.dump({"profile_batch": PROFILE, "steps_per_execution": 1, "batches": times}, out)


if __name__ == "__main__":
    main()
