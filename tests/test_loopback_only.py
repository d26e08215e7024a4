"""tools/loopback_only.py, which `make test` runs the suite under: loopback works inside, nothing else
is there, and where no namespace may be made the command still runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "loopback_only.py"
PROBE = """
import socket
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
socket.create_connection(server.getsockname(), timeout=2).close()
names = sorted(name for _, name in socket.if_nameindex())
print("loopback works;", ",".join(names))
"""


def test_the_command_runs_with_loopback_only_or_says_why_not():
    done = subprocess.run([sys.executable, str(TOOL), sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    if "no network namespace here" in done.stderr:
        assert len(done.stderr.strip().splitlines()) == 1
        pytest.skip(f"this machine allows no network namespace: {done.stderr.strip()}")
    assert done.stdout.strip() == "loopback works; lo"  # no other interface to reach anything through


def test_no_command_is_a_usage_line():
    done = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage: python tools/loopback_only.py COMMAND" in done.stderr
