"""A custom loop with a tf.function step and stallscope.step around each step; times its own steps.

usage: custom_loop.py stalled|healthy|busy|as_written LOG_DIR [--external] [--dataset] [--device-ms N]
  --external: the profile is taken with tf.profiler.experimental.start/stop, not stallscope.profile
  --dataset: the dataset is given to stallscope.profile, which records its stages as written and as run
  --device-ms N: each step ends in N ms of an emulated device's wait (no CPU), inside its step
"""
import contextlib
import json
import sys
import time

import tensorflow as tf

import pipelines
import stallscope
from stallscope.analysis.analyze import analyze_run

kind, log_dir = sys.argv[1], sys.argv[2]
external = "--external" in sys.argv
DEVICE_S = float(sys.argv[sys.argv.index("--device-ms") + 1]) / 1000.0 if "--device-ms" in sys.argv else 0.0
model = pipelines.model()
optimizer = tf.keras.optimizers.Adam()
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


own_ms = {}
dataset = pipelines.dataset(kind)
iterator = iter(dataset)
window = contextlib.nullcontext() if external else stallscope.profile(
    log_dir, steps=(10, 20), dataset=dataset if "--dataset" in sys.argv else None)
with window:
    for i in range(1, 25):
        if external and i == 10:
            tf.profiler.experimental.start(log_dir)
        started = time.perf_counter()
        with stallscope.step(i):
            x, y = next(iterator)
            train_step(x, y).numpy()
            time.sleep(DEVICE_S)
        own_ms[i] = (time.perf_counter() - started) * 1000.0
        if external and i == 20:
            tf.profiler.experimental.stop()

analysis = analyze_run(log_dir) if external else window.analyze()
print("RESULT " + json.dumps({
    "own_step_ms": own_ms,
    "analysis": {"verdict": analysis.verdict, "input_share": analysis.input_share, "bottleneck": analysis.bottleneck,
                 "profile_step_ms": {s.step: s.step_ms for s in analysis.steps.steps if s.counted},
                 "checklist": {c.key: c.answer for c in analysis.checklist},
                 "advice": [a.to_dict() for a in analysis.advice],
                 "rewrites": [change.describe() for change in analysis.rewrites]},
}))
