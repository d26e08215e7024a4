"""Diagnose a custom training loop with stallscope.step and stallscope.profile (README example)."""
import sys
import tempfile

import numpy as np
import tensorflow as tf

import stallscope

log_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="stallscope-loop-")

images = np.random.default_rng(0).random((64, 64, 64, 3), dtype=np.float32)
labels = np.arange(64) % 4
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(8).prefetch(tf.data.AUTOTUNE)

model = tf.keras.Sequential([
    tf.keras.Input((64, 64, 3)),
    tf.keras.layers.Conv2D(64, 3, activation="relu"),
    tf.keras.layers.GlobalAveragePooling2D(),
    tf.keras.layers.Dense(4),
])
optimizer = tf.keras.optimizers.Adam()
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


iterator = iter(dataset)
with stallscope.profile(log_dir, steps=(10, 20)) as window:
    for i in range(1, 25):
        with stallscope.step(i):           # the one line that makes every profile analysable
            x, y = next(iterator)
            train_step(x, y)

analysis = window.analyze()               # the same Analysis `stallscope analyze LOG_DIR` computes
print("verdict:", analysis.verdict, "input share:", round(analysis.input_share, 3), "bottleneck:", analysis.bottleneck)
