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
