"""The tiny data and pipelines the test programs train on: a stalled one (a slow sequential map,
no prefetch, TF's rewrites off so it runs as written), a healthy one (cached and prefetched), a busy one
(a parallel map of real CPU work) and the same written sequential (TF's rewrites make it parallel)."""
import time

import numpy as np
import tensorflow as tf

IMAGE = 64
BATCH = 8


def _slow(decode_s: float):
    """A map of `decode_s` of waiting per image (the default: 32 ms per batch of 8, far longer than the model step)."""
    def work(x):
        time.sleep(decode_s)
        return x

    def stage(image, label):
        return tf.ensure_shape(tf.numpy_function(work, [image], tf.float32, stateful=False), [IMAGE, IMAGE, 3]), label
    return stage


def _busy(image, label):
    square = tf.random.uniform([224, 224])
    return image + tf.reduce_mean(tf.linalg.matmul(square, square)) * 0.0, label


def dataset(kind: str, decode_s: float = 0.004) -> tf.data.Dataset:
    images = np.random.default_rng(0).random((64, IMAGE, IMAGE, 3), dtype=np.float32)
    base = tf.data.Dataset.from_tensor_slices((images, np.arange(64) % 4)).repeat()
    if kind == "stalled":
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_and_batch_fusion = False
        return base.map(_slow(decode_s)).batch(BATCH).with_options(options)
    if kind == "busy":  # real CPU work in a parallel map on TF's shared pool (a thread per CPU)
        return base.map(_busy, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE)
    if kind == "healthy":
        return base.batch(BATCH).cache().prefetch(tf.data.AUTOTUNE)
    if kind == "as_written":  # a sequential map, as most programs write it, which TF's rewrites make parallel
        return base.map(_busy).batch(BATCH)  # (no Python in it: a py function in parallel can hang the exit)
    raise ValueError(f"unknown pipeline {kind!r}")


def model() -> tf.keras.Model:
    net = tf.keras.Sequential([
        tf.keras.Input((IMAGE, IMAGE, 3)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(4),
    ])
    net.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return net


def stalled() -> tf.data.Dataset:
    """For `--dataset-fn pipelines.py:stalled`."""
    return dataset("stalled")


def broken() -> tf.data.Dataset:
    """A dataset function that fails, as user code may."""
    return dataset("no-such-kind")
