"""What the served-fit tests share: a dataset of small batches and a model that trains on it in a blink."""

from __future__ import annotations


def batches():
    import tensorflow as tf

    features = tf.data.Dataset.range(10_000).map(lambda i: (tf.fill([4], tf.cast(i, tf.float32)), i % 2))
    return features.batch(4)


def model():
    import tensorflow as tf

    net = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    net.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return net
