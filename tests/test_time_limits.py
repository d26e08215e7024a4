"""Every test has a time limit (pytest-timeout, set in pyproject.toml): a hang fails with its name and
the run goes on, instead of stalling CI until its own job limit."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_suite_sets_a_time_limit_of_minutes():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 60 <= float(options["timeout"]) <= 600, options.get("timeout")
    assert options["timeout_method"] == "signal"


def test_a_hung_test_fails_by_name_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_hang.py").write_text(
        "import threading\n"
        "def test_waits_forever():\n"
        "    threading.Event().wait()\n"
        "def test_after_the_hang():\n"
        "    assert True\n"
    )
    # The project's own settings, with a short limit so the hang ends in seconds.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-o", "timeout=3", str(tmp_path / "test_hang.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "FAILED" in out and "test_waits_forever" in out and "Timeout" in out, out
    assert "1 failed, 1 passed" in out, out
