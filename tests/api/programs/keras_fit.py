"""A Keras fit with StallMonitor; times its own steps and prints the comparison as JSON.

usage: keras_fit.py stalled|healthy|busy|as_written LOG_DIR [--no-window] [--dataset] [--device-ms N]
  --device-ms N: each step ends in N ms of an emulated device's wait (no CPU), inside its step marker
"""
import json
import sys
import time

import tensorflow as tf

import pipelines
import stallscope.keras

kind, log_dir = sys.argv[1], sys.argv[2]
window = None if "--no-window" in sys.argv else (10, 20)
DEVICE_S = float(sys.argv[sys.argv.index("--device-ms") + 1]) / 1000.0 if "--device-ms" in sys.argv else 0.0


class DeviceWait(tf.keras.callbacks.Callback):
    """An emulated device's wait at the end of each step: listed first, so it falls inside both the
    program's own timer and StallMonitor's step marker (callbacks end in the order given)."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(DEVICE_S)


class OwnTimer(tf.keras.callbacks.Callback):
    """The program's own wall clock of each step, from on_train_batch_begin to on_train_batch_end."""

    def __init__(self):
        super().__init__()
        self.step_ms, self._step, self._started = {}, 0, 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._step += 1
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step_ms[self._step] = (time.perf_counter() - self._started) * 1000.0


timer = OwnTimer()
dataset = pipelines.dataset(kind)
monitor = stallscope.keras.StallMonitor(profile_steps=window, log_dir=log_dir,
                                        dataset=dataset if "--dataset" in sys.argv else None)
model = pipelines.model()
model.fit(dataset, steps_per_epoch=12, epochs=2, callbacks=[*([DeviceWait()] if DEVICE_S else []), timer, monitor],
          verbose=0)
result = {"own_step_ms": timer.step_ms, "analysis": None}
if monitor.analysis is not None:
    analysis = monitor.analysis
    result["analysis"] = {
        "verdict": analysis.verdict, "input_share": analysis.input_share, "bottleneck": analysis.bottleneck,
        "profile_step_ms": {s.step: s.step_ms for s in analysis.steps.steps if s.counted},
        "checklist": {c.key: c.answer for c in analysis.checklist},
        "advice": [a.to_dict() for a in analysis.advice],
        "rewrites": [change.describe() for change in analysis.rewrites],
    }
print("RESULT " + json.dumps(result))
