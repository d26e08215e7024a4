"""Benchmark: what the Python API costs a user's training step, against the same loop without it.

In one run, on a small real Keras model fed from an in-memory, prefetched dataset (so the step is
the model's, about 10-20 ms on a CPU):
- Keras `fit` plain vs with `StallMonitor(profile_steps=None)` (step markers and steps.csv, outside
  any profiled window; target: ratio < 1.02) vs with a window over every measured step (inside the
  profiled window; target: < 1.05);
- a custom loop plain vs with `stallscope.step(i)` (outside a window, < 1.02) vs inside
  `stallscope.profile` over every measured step (< 1.05).
Inside a window most of the cost is TF's own profiler, which a user pays with any profile; so the
window is also run with TF's profiler alone over the same steps (Keras' TensorBoard callback with
profile_batch, and tf.profiler.experimental.start/stop around the loop's steps), and stallscope's
share is the ratio to that.
Since a shared machine's noise can exceed these costs, the marker's own cost per step is also timed
directly (many empty `stallscope.step` blocks and StallMonitor batch calls outside a window) and given
as a share of the baseline step. Rounds alternate the variants so machine noise hits all alike; step time is the mean over the steps
after a warm-up, from timestamps taken identically in every variant; a ratio is the median over
rounds of each round's ratio to that round's own baseline, so slow phases of a shared machine cancel.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    import numpy as np
    import tensorflow as tf

    import stallscope
    from stallscope.keras import StallMonitor

    images = np.random.default_rng(0).random((64, 64, 64, 3), dtype=np.float32)
    dataset = (tf.data.Dataset.from_tensor_slices((images, np.arange(64) % 4)).batch(32).cache().repeat()
               .prefetch(tf.data.AUTOTUNE))

    def model():
        net = tf.keras.Sequential([
            tf.keras.Input((64, 64, 3)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(4),
        ])
        net.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return net

    total = args.warmup + args.steps
    window = (args.warmup + 1, total)

    class Stamps(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    def measured_ms(ends):
        return (ends[total - 1] - ends[args.warmup - 1]) * 1000.0 / args.steps

    def fit(variant, tmp):
        stamps = Stamps()
        callbacks = [stamps]
        if variant == "outside":
            callbacks.append(StallMonitor(profile_steps=None, log_dir=tmp / "fit-outside", verbose=False))
        elif variant == "inside":
            callbacks.append(StallMonitor(profile_steps=window, log_dir=tmp / "fit-inside", verbose=False))
        elif variant == "tf-profiler":
            callbacks.append(tf.keras.callbacks.TensorBoard(log_dir=str(tmp / "fit-tb"), profile_batch=window,
                                                            write_graph=False, update_freq=10**9))
        model().fit(dataset, steps_per_epoch=total, epochs=1, callbacks=callbacks, verbose=0)
        return measured_ms(stamps.ends)

    def loop(variant, tmp):
        net = model()
        optimizer = tf.keras.optimizers.Adam()
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, net(x, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, net.trainable_variables), net.trainable_variables))
            return loss

        iterator = iter(dataset)
        ends = []
        marker = (lambda i: contextlib.nullcontext()) if variant == "plain" else stallscope.step
        profiled = stallscope.profile(tmp / "loop-inside", steps=window) if variant == "inside" \
            else contextlib.nullcontext()
        if variant == "tf-profiler":
            marker = lambda i: contextlib.nullcontext()  # noqa: E731
        with profiled:
            for i in range(1, total + 1):
                if variant == "tf-profiler" and i == window[0]:
                    tf.profiler.experimental.start(str(tmp / "loop-tf"))
                with marker(i):
                    x, y = next(iterator)
                    train_step(x, y).numpy()
                ends.append(time.perf_counter())
        if variant == "tf-profiler":
            tf.profiler.experimental.stop()
        return measured_ms(ends)

    variants = ("plain", "outside", "inside", "tf-profiler")
    results = {(kind, v): [] for kind in ("fit", "loop") for v in variants}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        per_step_us = direct_costs_us(stallscope, StallMonitor, tmp_dir=tmp / "direct")
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else tuple(reversed(variants))
            for variant in order:
                results[("fit", variant)].append(fit(variant, tmp / f"r{round_}"))
                results[("loop", variant)].append(loop(variant, tmp / f"r{round_}"))
    print(f"small Conv model, batch 32 of 64x64 from memory, {args.steps} measured steps after "
          f"{args.warmup}, {args.rounds} rounds (medians)")
    for kind, label in (("fit", "Keras fit, StallMonitor"), ("loop", "custom loop, stallscope.step")):
        plain = results[(kind, "plain")]
        print(f"{label}")
        print(f"  without it            {statistics.median(plain):8.2f} ms/step  (baseline)")
        for variant, target in (("outside", 1.02), ("inside", 1.05)):
            values = results[(kind, variant)]
            ratio = statistics.median(v / b for v, b in zip(values, plain))
            where = "outside the window" if variant == "outside" else "inside the window "
            print(f"  {where}    {statistics.median(values):8.2f} ms/step  ratio {ratio:.3f}  "
                  f"(target < {target:.2f}; rounds {', '.join(f'{v / b:.3f}' for v, b in zip(values, plain))})")
        values, alone = results[(kind, "inside")], results[(kind, "tf-profiler")]
        ratio = statistics.median(v / b for v, b in zip(values, alone))
        print(f"  TF's profiler alone     {statistics.median(alone):8.2f} ms/step  inside the window with "
              f"stallscope vs TF's profiler alone: ratio {ratio:.3f}  (target < 1.05)")
        cost = per_step_us[kind]
        print(f"  its own cost outside a window: {cost:.1f} us per step = "
              f"{cost / 1000.0 / statistics.median(plain) * 100:.3f}% of the baseline step")


def direct_costs_us(stallscope, monitor_class, *, tmp_dir: Path, calls: int = 20000) -> dict[str, float]:
    """Microseconds per step of an empty stallscope.step block and of StallMonitor's two batch calls."""
    started = time.perf_counter()
    for i in range(calls):
        with stallscope.step(i + 1):
            pass
    step_us = (time.perf_counter() - started) * 1e6 / calls
    monitor = monitor_class(profile_steps=None, log_dir=tmp_dir, verbose=False)
    monitor.on_train_begin()
    started = time.perf_counter()
    for i in range(calls):
        monitor.on_train_batch_begin(i)
        monitor.on_train_batch_end(i, {})
    monitor_us = (time.perf_counter() - started) * 1e6 / calls
    return {"loop": step_us, "fit": monitor_us}


if __name__ == "__main__":
    main()
