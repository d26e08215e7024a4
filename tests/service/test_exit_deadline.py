"""The stop deadline of `stallscope serve` ends the process even while a C call holds the GIL (as TF's
worker stop does when its dispatcher is gone): no Python code can run then, so the C library keeps it."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A C call made through ctypes.PyDLL keeps the GIL for its whole length, as TF's pybind stop does.
HOLDS_THE_GIL = ("import ctypes, sys\nfrom stallscope.service.exit_deadline import ExitDeadline\n"
                 "deadline = ExitDeadline(1.0, 130, 'stallscope serve: it did not stop')\n"
                 "if sys.argv[1] == 'cancel':\n    deadline.cancel()\n"
                 "ctypes.PyDLL(None).sleep(int(sys.argv[2]))\nprint('the C call returned', flush=True)\n")


@pytest.mark.timeout(120)
def test_the_deadline_ends_a_process_whose_gil_is_held_with_its_line_and_code():
    done = subprocess.run([sys.executable, "-c", HOLDS_THE_GIL, "arm", "600"], capture_output=True, text=True,
                          timeout=90)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "stallscope serve: it did not stop\n")


@pytest.mark.timeout(120)
def test_a_cancelled_deadline_leaves_the_process_to_end_as_it_would():
    done = subprocess.run([sys.executable, "-c", HOLDS_THE_GIL, "cancel", "3"], capture_output=True, text=True,
                          timeout=90)
    assert (done.returncode, done.stdout, done.stderr) == (0, "the C call returned\n", "")
