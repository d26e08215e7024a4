"""Benchmark: how long `stallscope analyze` takes to answer on a 100-step Keras profile.

Why: a reader of profiles should answer at once; TensorFlow's import alone is seconds. In one run it
times, each as a fresh process (median of --repeats): `python -c pass` (the interpreter's own start),
`stallscope --help`, `stallscope analyze LOG --no-xprof` and `stallscope analyze LOG` (with TensorBoard's
cross-check), and says whether `analyze` imported TensorFlow. Target: analyze --no-xprof under 1 s.
The profile is made first by a Keras `fit` with StallMonitor over 100 steps (LOG kept with --log).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = 100
# Runs analyze in-process, then says whether TensorFlow was ever imported.
PROBE = ("import sys; from stallscope.cli.main import main; code = main(sys.argv[1:]); "
         "print('tensorflow imported:', 'tensorflow' in sys.modules, file=sys.stderr); raise SystemExit(code)")


def make_profile(log_dir: Path) -> None:
    """A Keras fit of STEPS steps, every one profiled, in its own process (this one stays TF-free)."""
    program = f"""
import numpy as np, tensorflow as tf
from stallscope.keras import StallMonitor
images = np.random.default_rng(0).random((64, 32, 32, 3), dtype=np.float32)
data = tf.data.Dataset.from_tensor_slices((images, np.arange(64) % 4)).repeat().batch(8).prefetch(2)
model = tf.keras.Sequential([tf.keras.Input((32, 32, 3)), tf.keras.layers.Conv2D(8, 3),
                             tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(4)])
model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data, steps_per_epoch={STEPS}, epochs=1, verbose=0,
          callbacks=[StallMonitor(profile_steps=(1, {STEPS}), log_dir={str(log_dir)!r}, verbose=False)])
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode != 0:
        raise SystemExit(f"making the profile failed: {done.stderr.strip()[-400:]}")


def wall_s(argv: list[str], repeats: int) -> tuple[float, str]:
    """Median wall time of `argv` as a fresh process, and the last run's stderr."""
    times, err = [], ""
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
        err = done.stderr
    return statistics.median(times), err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--log", type=Path, default=None, help="profile folder to reuse or keep (default: temporary)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = args.log or Path(tmp) / "log"
        if not (log.exists() and any(log.rglob("*.xplane.pb"))):
            make_profile(log)
        py = sys.executable
        rows = [("python -c pass", [py, "-c", "pass"]),
                ("stallscope --help", [py, "-m", "stallscope", "--help"]),
                ("analyze --no-xprof", [py, "-c", PROBE, "analyze", str(log), "--no-xprof"]),
                ("analyze", [py, "-c", PROBE, "analyze", str(log)])]
        results = {name: wall_s(argv, args.repeats) for name, argv in rows}
    base = results["python -c pass"][0]
    print(f"cli_startup: {STEPS}-step Keras profile, median of {args.repeats} fresh processes")
    for name, (seconds, err) in results.items():
        tf_note = next((line for line in err.splitlines() if line.startswith("tensorflow imported:")), "")
        print(f"  {name:20s} {seconds:6.2f} s  ({seconds / base:5.1f}x python -c pass)  {tf_note}")
    target = results["analyze --no-xprof"][0]
    print(f"analyze --no-xprof: {target:.2f} s (target < 1 s: {'met' if target < 1.0 else 'NOT met'})")


if __name__ == "__main__":
    main()
