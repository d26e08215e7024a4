"""Runs the test programs (and the README's examples) as real programs in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).parent / "programs"
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240


def run_python(script: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([str(PROGRAMS), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT_S, cwd=cwd)
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture
def run_program():
    """run_program(NAME, *args) -> the JSON the program printed after 'RESULT '."""

    def run(name: str, *args: str) -> dict:
        done = run_python(PROGRAMS / name, *args)
        line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
        return json.loads(line[len("RESULT "):])

    return run


@pytest.fixture
def run_script():
    """run_script(PATH, *args, cwd=None) -> the finished process (asserted to have succeeded)."""
    return run_python


def tiny_model(steps_per_execution: int = 1):
    """A Keras model of one Dense layer over 4 features, compiled: a fit of it takes milliseconds."""
    import tensorflow as tf

    net = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    net.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                steps_per_execution=steps_per_execution)
    return net


def tiny_data(rows: int = 32):
    """`rows` inputs and labels for `tiny_model`."""
    import numpy as np

    return np.zeros((rows, 4), np.float32), np.zeros((rows,), np.int64)
