"""tools/cpu_hog.py, which `make test-loaded` runs the suite under: the hogs spin while the command runs,
the command's exit status is passed on, and no hog outlives the tool, even one killed by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "cpu_hog.py"
# The command: waits until each hog has used some CPU (the hogs spin), prints their PIDs, exits 3.
SEES_THE_HOGS = """
import os, sys, time, psutil
pids = [int(p) for p in os.environ["STALLSCOPE_CPU_HOG_PIDS"].split(",")]
hogs = [psutil.Process(p) for p in pids]
deadline = time.monotonic() + 60
while not all(sum(h.cpu_times()[:2]) > 0.05 for h in hogs):
    assert time.monotonic() < deadline, "a hog used no CPU in 60 s"
    time.sleep(0.05)
print(",".join(map(str, pids)))
sys.exit(3)
"""


def _gone(pids: list[int], within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(120)
def test_the_hogs_spin_while_the_command_runs_and_end_with_it():
    done = subprocess.run([sys.executable, str(TOOL), "--cores", "2", "--", sys.executable, "-c", SEES_THE_HOGS],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 3, done.stderr
    pids = [int(p) for p in done.stdout.strip().split(",")]
    assert len(pids) == 2 and f"PID {pids[0]}, {pids[1]}" in done.stderr
    assert _gone(pids)


@pytest.mark.timeout(120)
def test_no_hog_outlives_a_killed_tool():
    tool = subprocess.Popen([sys.executable, str(TOOL), "--", sys.executable, "-c", "import time; time.sleep(600)"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = tool.stderr.readline()  # printed once the hog is started
        hog = int(line.split("PID ")[1].split()[0])
        command = [c.pid for c in psutil.Process(tool.pid).children() if c.pid != hog]
        os.kill(tool.pid, signal.SIGKILL)
        tool.wait(timeout=30)
        assert _gone([hog]), "the hog spun on after its tool was killed"
    finally:
        for pid in command if "command" in locals() else ():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_command_is_required():
    bad = subprocess.run([sys.executable, str(TOOL), "--cores", "1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected --cores of 1 or more and a command" in bad.stderr
