"""A user's Keras `fit` under `steps_per_execution`, as `stallscope capture` meets it: a tf.data input, a
small model compiled with steps_per_execution=--per-step, the one line that starts a profiler server,
and no step marker of stallscope's (the capture finds Keras' own calls of its train function).

It writes its own wall-clock time of every call of the train function to --timing (JSON lines: step,
step_ms, batches) and stops itself at --seconds or when --stop-file appears. --start-file keeps it
waiting, model built and server up, until that file appears (a test starts it early, beside others).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

IMAGE_SIZE = 16
BATCH = 8


class Timing(tf.keras.callbacks.Callback):
    """One line per call of the train function; stops the fit at the deadline or the stop file."""

    def __init__(self, path: Path, per_step: int, seconds: float, stop_file: Path) -> None:
        super().__init__()
        self.handle = path.open("w", encoding="utf-8")
        self.per_step, self.stop_file = per_step, stop_file
        self.deadline = time.monotonic() + seconds
        self.started = 0.0

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        step_ms = (time.perf_counter() - self.started) * 1000.0
        self.handle.write(json.dumps({"step": batch, "step_ms": step_ms, "batches": self.per_step}) + "\n")
        self.handle.flush()
        if time.monotonic() > self.deadline or self.stop_file.exists():
            self.model.stop_training = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timing", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--stop-file", type=Path, required=True)
    parser.add_argument("--per-step", type=int, default=4)
    parser.add_argument("--start-file", type=Path)
    args = parser.parse_args()

    tf.profiler.experimental.server.start(args.port)  # the one line a user adds
    images = tf.random.stateless_uniform((BATCH * 8, IMAGE_SIZE, IMAGE_SIZE, 3), seed=(1, 2))
    dataset = tf.data.Dataset.from_tensor_slices((images, tf.range(BATCH * 8) % 4)).batch(BATCH).repeat()
    model = tf.keras.Sequential([
        tf.keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(4),
    ])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=args.per_step)
    began = time.monotonic()
    while args.start_file is not None and not args.start_file.exists() and not args.stop_file.exists():
        if time.monotonic() - began > args.seconds:
            os._exit(0)
        time.sleep(0.05)
    model.fit(dataset, steps_per_epoch=10**6, epochs=1, verbose=0,
              callbacks=[Timing(args.timing, args.per_step, args.seconds, args.stop_file)])
    os._exit(0)  # nothing left to keep; TF's teardown of the input threads is slow


if __name__ == "__main__":
    main()
