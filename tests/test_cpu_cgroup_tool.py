"""tools/cpu_cgroup.py, which the README's CPU-quota figures and benchmarks/cpu_quota.py run under:
the command runs under the quota, the throttling is reported, the cgroup is gone after; where no
cgroup may be made, one line and exit 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import cpu_cgroup as tool  # tools/, put on the path by conftest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "cpu_cgroup.py"
BUSY = "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass\n"


def test_a_busy_command_runs_out_of_its_quota_and_leaves_no_cgroup():
    found = tool.writable_parent()
    before = set(found[0].glob("stallscope-*")) if found else set()
    done = subprocess.run([sys.executable, str(TOOL), "--cpus", "0.2", "--", sys.executable, "-c", BUSY],
                          capture_output=True, text=True, timeout=60)
    if found is None:
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "needs root" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    share = re.search(r"a quota of 0.2 CPUs ran out in (\d+)% of (\d+) periods, ([\d.]+) s held back", done.stderr)
    assert share is not None, done.stderr
    assert int(share.group(1)) >= 50 and int(share.group(2)) >= 5 and float(share.group(3)) > 0.5
    assert set(found[0].glob("stallscope-*")) == before


def test_the_commands_exit_status_is_passed_on_and_flags_are_checked():
    if tool.writable_parent() is not None:
        done = subprocess.run([sys.executable, str(TOOL), "--cpus", "1", "--", sys.executable, "-c", "raise SystemExit(3)"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 3, done.stderr
    bad = subprocess.run([sys.executable, str(TOOL), "--cpus", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected --cpus N" in bad.stderr
