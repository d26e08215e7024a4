"""Your own tf.data pipeline over images in a bucket, read by stallscope's readers (README example;
tests run it on the emulated store). TF 2.21 cannot open s3:// at all, and its gs:// opens a new
connection per request; `stallscope.read_files` keeps many requests in flight over kept-alive ones.

    python examples/bucket_pipeline.py s3://my-bucket/images     # {label}/*.jpg below it
"""
import sys

import tensorflow as tf

import stallscope

URL = sys.argv[1] if len(sys.argv) > 1 else "s3://my-bucket/images"

files = stallscope.list_files(URL, "*.jpg")       # one listing, kept for this process
names = sorted({f.split("/")[-2] for f in files})
labels = [names.index(f.split("/")[-2]) for f in files]


def decode(jpeg, label):
    image = tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (64, 64)) / 255.0
    return image, label


dataset = tf.data.Dataset.from_tensor_slices((files, labels)).shuffle(len(files), seed=0).repeat()
dataset = stallscope.read_files(dataset, in_flight=64)   # (path, label) -> (bytes, label)
dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(8).prefetch(tf.data.AUTOTUNE)

model = tf.keras.Sequential([
    tf.keras.Input((64, 64, 3)),
    tf.keras.layers.Conv2D(16, 3, activation="relu"),
    tf.keras.layers.GlobalAveragePooling2D(),
    tf.keras.layers.Dense(len(names)),
])
model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

diagnosis = stallscope.diagnose(dataset, model=model, steps=10, files=files)
print(diagnosis.text())
print("verdict:", diagnosis.verdict, "input share:", round(diagnosis.input_share, 3), "cause:", diagnosis.cause)

before = stallscope.store_requests()                # what the readers asked the store for, so far
model.fit(dataset, steps_per_epoch=5, epochs=1, verbose=0)
made = stallscope.store_requests().since(before)
print(f"fit: {made.requests} requests, {made.bytes / 1e6:.1f} MB, "
      f"{made.percentile_ms(0.5):.1f} ms median from asking to the last byte")
