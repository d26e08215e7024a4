"""A user's own training program, as `stallscope capture` meets it: a tf.data input, a small Keras
model stepped by a `tf.function`, the one line that starts a profiler server, and a step marker.

It writes its own wall-clock time of every step to --timing (JSON lines: step, step_ms), so a test
can hold the profile's step time against it. It stops itself at --seconds or when --stop-file
appears. --start-file keeps it idle (server up, no steps) until that file appears; it touches
--idle-file once the idle job has settled (its prefetch filled), so a capture then records nothing;
--die-during-capture makes it exit abruptly after 20 steps run while a capture traces it.

--stalled gives the seeds' slow input: a sequential JPEG decode and resize, no prefetch, TF's
automatic rewrites off. Without it the decoded batches are cached in memory and prefetched.
--device-ms N adds an emulated device's wait (no CPU) to every step after the model's: a step long
enough that the few ms a loaded machine makes a get_next wait for a core stay far below 5% of it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

IMAGE_SIZE = 32
BATCH = 8


def dataset(stalled: bool) -> tf.data.Dataset:
    noise = tf.random.stateless_uniform((240, 320, 3), seed=(1, 2), maxval=256, dtype=tf.int32)
    jpeg = tf.io.encode_jpeg(tf.cast(noise, tf.uint8), quality=90)

    def decode(index):
        image = tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (IMAGE_SIZE, IMAGE_SIZE)) / 255.0
        return image, index % 4

    if stalled:
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_and_batch_fusion = False
        options.autotune.enabled = False
        return tf.data.Dataset.range(10**9).map(decode).batch(BATCH).with_options(options)
    return tf.data.Dataset.range(BATCH * 4).map(decode).batch(BATCH).cache().repeat().prefetch(2)


def tracing() -> bool:
    """Whether a profiler session records now (TF has no public call for it)."""
    from tensorflow.python.profiler import trace

    return bool(trace.enabled())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timing", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--stop-file", type=Path)
    parser.add_argument("--start-file", type=Path)
    parser.add_argument("--idle-file", type=Path)
    parser.add_argument("--die-during-capture", action="store_true")
    parser.add_argument("--stalled", action="store_true")
    parser.add_argument("--device-ms", type=float, default=0.0)
    args = parser.parse_args()

    tf.profiler.experimental.server.start(args.port)  # the one line a user adds
    model = tf.keras.Sequential([
        tf.keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(4),
    ])
    optimizer = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    iterator = iter(dataset(args.stalled))
    began = time.monotonic()

    def stopped() -> bool:
        return time.monotonic() - began > args.seconds or bool(args.stop_file and args.stop_file.exists())

    idle_since = time.monotonic()
    while args.start_file is not None and not args.start_file.exists() and not stopped():
        if args.idle_file is not None and time.monotonic() - idle_since > 1.0:
            args.idle_file.touch()
        time.sleep(0.05)
    traced_steps = 0
    with args.timing.open("w", encoding="utf-8") as timing:
        step = 0
        while not stopped():
            if args.die_during_capture and traced_steps >= 20:
                os._exit(3)
            traced_steps += int(tracing())
            with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
                start = time.perf_counter()
                images, labels = next(iterator)
                train_step(images, labels).numpy()
                time.sleep(args.device_ms / 1000.0)
                step_ms = (time.perf_counter() - start) * 1000.0
            timing.write(json.dumps({"step": step, "step_ms": step_ms}) + "\n")
            timing.flush()
            step += 1
    # Out now: TF's teardown waits on the input pipeline's threads (a stalled job's sleeping map took ~18 s
    # after its stop file), and there is nothing left to keep.
    os._exit(0)


if __name__ == "__main__":
    main()
