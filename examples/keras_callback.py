"""Diagnose a Keras `fit` with stallscope's callback (README example; tests run it at tiny sizes)."""
import sys
import time

import numpy as np
import tensorflow as tf

import stallscope.keras

STALLED = "--stalled" in sys.argv   # a slow sequential map and no prefetch
STEPS = 24


def slow_decode(image, label):
    """Stands in for a costly decode: 10 ms of Python per image."""
    def work(x):
        time.sleep(0.01)
        return x
    image = tf.numpy_function(work, [image], tf.float32, stateful=False)
    return tf.ensure_shape(image, [64, 64, 3]), label


images = np.random.default_rng(0).random((64, 64, 64, 3), dtype=np.float32)
labels = np.arange(64) % 4
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
if STALLED:
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_and_batch_fusion = False
    dataset = dataset.map(slow_decode).batch(8).with_options(options)
else:
    dataset = dataset.batch(8).cache().prefetch(tf.data.AUTOTUNE)

model = tf.keras.Sequential([
    tf.keras.Input((64, 64, 3)),
    tf.keras.layers.Conv2D(32, 3, activation="relu"),
    tf.keras.layers.GlobalAveragePooling2D(),
    tf.keras.layers.Dense(4, activation="softmax"),
])
model.compile("adam", "sparse_categorical_crossentropy")

log_dir = next((a for a in sys.argv[1:] if not a.startswith("--")), None)  # None: a new temporary directory
monitor = stallscope.keras.StallMonitor(profile_steps=(10, 20), log_dir=log_dir)
model.fit(dataset, steps_per_epoch=STEPS, epochs=1, callbacks=[monitor], verbose=0)

analysis = monitor.analysis
print("verdict:", analysis.verdict, "input share:", round(analysis.input_share, 3), "bottleneck:", analysis.bottleneck)
