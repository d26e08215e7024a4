"""Benchmark: does `stallscope.diagnose` read the input share of a pipeline of your own as a long
training loop does, whatever the shape of its shuffle and repeat?

For each pipeline shape below, on the built-in data set's training JPEGs (read, decoded and resized
to 64 px in an AUTOTUNE map, batches of 8) and an emulated device of `--step-ms` a step:
- `stallscope.diagnose(dataset, steps=--steps)`: its input share and end-to-end window;
- the baseline, measured in the same run: the same dataset in a plain loop of `--passes` whole passes
  (its first pass left out), the share of the loop's time spent waiting for `next()`;
- their ratio (1.00x: the diagnosis reads what training sees).

Shapes: a shuffle of decoded images refilling at each pass start (finite, as `fit(epochs=...)` iterates
it, and repeated, as `fit(steps_per_epoch=...)` does); the same shuffle fused with the repeat right
after it (it keeps its buffer); a shuffle of file names before the map (nothing to refill); and
seed-002's pipeline written by hand over TFRecords `stallscope convert` made from the same JPEGs
(TFRecordDataset -> parse and decode -> shuffle(10240) -> batch -> repeat), whose pass TF cannot count.

usage: python benchmarks/own_dataset_window.py [--steps 20] [--step-ms 1] [--passes 4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SIZE = 64
BATCH = 8


def shapes(files: list[str], shards: list[str]) -> dict:
    """name -> dataset."""
    import tensorflow as tf

    def load(path):
        image = tf.image.decode_jpeg(tf.io.read_file(path), channels=3)
        return tf.image.resize(image, [SIZE, SIZE]) / 255.0, tf.strings.length(path) % 4

    def parse(record):
        features = tf.io.parse_single_example(record, {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                                                       "image/class/label": tf.io.FixedLenFeature([], tf.int64)})
        image = tf.image.decode_jpeg(features["image/encoded"], channels=3)
        return tf.image.resize(image, [SIZE, SIZE]) / 255.0, features["image/class/label"]

    names = tf.data.Dataset.from_tensor_slices(files)
    decoded = names.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    every = len(files)
    return {
        "shuffle decoded, finite (fit epochs)": decoded.shuffle(every).batch(BATCH).prefetch(tf.data.AUTOTUNE),
        "shuffle decoded, repeated (steps_per_epoch)":
            decoded.shuffle(every).batch(BATCH).repeat().prefetch(tf.data.AUTOTUNE),
        "shuffle decoded, fused with repeat": decoded.shuffle(every).repeat().batch(BATCH).prefetch(tf.data.AUTOTUNE),
        "shuffle names, repeated": names.shuffle(every).map(load, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(BATCH).repeat().prefetch(tf.data.AUTOTUNE),
        "records, seed-002 by hand, repeated": tf.data.TFRecordDataset(shards).map(parse).shuffle(10240)
            .batch(BATCH).repeat(),
    }


def loop_share(dataset, steps_per_pass: int, passes: int, step_s: float) -> float:
    """Share of a plain loop's time waiting for the next batch, over `passes` passes after a first."""
    iterator = iter(dataset.repeat())  # a finite dataset passes again, as Keras iterates it each epoch
    for _ in range(steps_per_pass):
        next(iterator)
    waited = 0.0
    started = time.perf_counter()
    for _ in range(steps_per_pass * passes):
        before = time.perf_counter()
        next(iterator)
        waited += time.perf_counter() - before
        time.sleep(step_s)  # the device's step: no CPU, as the emulated device
    return waited / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="the diagnosis' steps (default 20)")
    parser.add_argument("--step-ms", type=float, default=1.0, help="the emulated device's step (default 1 ms)")
    parser.add_argument("--passes", type=int, default=4, help="the loop's passes after its first (default 4)")
    parser.add_argument("--data", help="an image tree (default: the built-in data set, made here)")
    args = parser.parse_args()

    import stallscope
    from stallscope.data.synthetic import SyntheticOptions, make_synthetic
    from stallscope.records.convert import ConvertOptions, convert_tree

    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(args.data) if args.data else Path(scratch) / "synthetic"
        if not args.data:
            make_synthetic(tree, SyntheticOptions())
        files = sorted(str(p) for p in (tree / "train").glob("*/*.jp*g"))
        records = Path(scratch) / "records"
        convert_tree(ConvertOptions(tree / "train", records, shards=4))
        shards = sorted(str(p) for p in records.glob("*.tfrecord"))
        steps_per_pass = -(-len(files) // BATCH)
        print(f"{len(files)} JPEGs, {steps_per_pass} steps a pass, batches of {BATCH}, a {args.step_ms:g} ms step, "
              f"diagnose steps={args.steps}, loop of {args.passes} passes")
        print(f"{'pipeline':<44} {'window':>7} {'diagnose':>9} {'loop':>6} {'ratio':>6}")
        for name, dataset in shapes(files, shards).items():
            diagnosis = stallscope.diagnose(dataset, accelerator=f"emulated:{args.step_ms:g}ms", steps=args.steps)
            measured = loop_share(dataset, steps_per_pass, args.passes, args.step_ms / 1e3)
            window = diagnosis.phases[0].end_to_end.steps
            print(f"{name:<44} {window:>7} {diagnosis.input_share:>9.1%} {measured:>6.1%} "
                  f"{diagnosis.input_share / measured:>5.2f}x")


if __name__ == "__main__":
    main()
