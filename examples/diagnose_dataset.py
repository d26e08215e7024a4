"""Diagnose your own tf.data.Dataset with stallscope.diagnose (README example; tests run it).

`make_dataset` and `make_model` also work from the command line:
    stallscope diagnose --dataset-fn examples/diagnose_dataset.py:make_dataset \
                        --model-fn examples/diagnose_dataset.py:make_model
"""
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

import stallscope

RECORDS = os.path.join(tempfile.gettempdir(), "stallscope-example-records")


def write_records(count=128):
    """A few TFRecord shards of small random images, standing in for your own data."""
    os.makedirs(RECORDS, exist_ok=True)
    rng = np.random.default_rng(0)
    for shard in range(4):
        with tf.io.TFRecordWriter(os.path.join(RECORDS, f"train-{shard}.tfrecord")) as writer:
            for i in range(count // 4):
                jpeg = tf.io.encode_jpeg(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)).numpy()
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 4])),
                }))
                writer.write(example.SerializeToString())


def decode(record):
    features = tf.io.parse_single_example(record, {
        "image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.image.resize(tf.io.decode_jpeg(features["image"], channels=3), (64, 64)) / 255.0
    return image, features["label"]


def make_dataset(stalled=True):
    """A sequential decode map and no prefetch (stalled), or decoded images cached and prefetched (healthy)."""
    if not os.path.isdir(RECORDS):
        write_records()
    files = tf.data.Dataset.list_files(os.path.join(RECORDS, "*.tfrecord"), shuffle=False)
    records = tf.data.TFRecordDataset(files)
    if stalled:
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_and_batch_fusion = False
        return records.map(decode).batch(16).with_options(options)
    return records.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache().batch(16).prefetch(tf.data.AUTOTUNE)


def make_model():
    model = tf.keras.Sequential([
        tf.keras.Input((64, 64, 3)),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(4),
    ])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


if __name__ == "__main__":
    diagnosis = stallscope.diagnose(make_dataset(stalled="--healthy" not in sys.argv), model=make_model(), steps=20)
    print(diagnosis.text())   # the report `stallscope diagnose` prints
    print("verdict:", diagnosis.verdict, "input share:", round(diagnosis.input_share, 3), "cause:", diagnosis.cause)
