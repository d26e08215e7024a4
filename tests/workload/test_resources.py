"""CPU sampling and /proc/self/io deltas taken during a run."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.workload.resources import ResourceMonitor, files_opened, io_delta, read_proc_io

# CPU shares of short busy runs, measured: another test beside it would take the CPU they count.
pytestmark = pytest.mark.whole_machine

needs_proc_io = pytest.mark.skipif(read_proc_io() is None, reason="the kernel offers no /proc/self/io")


@needs_proc_io
def test_monitor_counts_bytes_and_calls_read(tmp_path):
    data = tmp_path / "blob.bin"
    data.write_bytes(os.urandom(256 * 1024))
    with ResourceMonitor(interval_s=0.02) as monitor:
        with open(data, "rb", buffering=0) as handle:  # unbuffered: one read call per 4 KiB, whatever the file system
            while handle.read(4096):
                pass
        # Some CPU work for the sampler to see, until it has sampled (bounded: a loaded machine may be slow).
        deadline = time.perf_counter() + 5.0
        while (len(monitor._samples) < 2 or time.perf_counter() < monitor._started + 0.1) and time.perf_counter() < deadline:
            sum(range(1000))
    report = monitor.report
    assert report.io["rchar"] >= 256 * 1024
    assert report.io["syscr"] >= 64
    assert len(report.samples) >= 2
    summary = report.summary()
    assert summary["cores"] >= 1
    assert 0 < summary["process_max_percent"] <= 100 * summary["cores"] + 1
    assert 0 <= summary["system_mean_percent"] <= 100
    assert summary["process_cpu_seconds"] > 0
    written = report.to_dict()
    assert written["io"] == report.io and len(written["samples"]) == len(report.samples)


def test_io_delta_handles_missing_counters():
    assert io_delta(None, {"rchar": 1}) is None
    assert io_delta({"rchar": 5, "syscr": 1}, {"rchar": 12, "syscr": 4}) == {"rchar": 7, "syscr": 3}


def test_files_opened_from_the_file_list():
    assert files_opened("files", images=40, files_in_source=24, passes=40 / 24) == 40
    assert files_opened("records", images=40, files_in_source=2, passes=40 / 24) == 4
    assert files_opened("records", images=4, files_in_source=2, passes=4 / 24) == 1



BUSY_RUN = """
import hashlib, json, time
from stallscope.workload.resources import ResourceMonitor
blob = bytes(1 << 20)
with ResourceMonitor(interval_s=0.5) as monitor:
    deadline = time.perf_counter() + 15.0
    while len(monitor._samples) < 3 and time.perf_counter() < deadline:
        hashlib.sha256(blob).digest()  # busy without holding the GIL, as TF's kernels are
print(json.dumps(monitor.report.to_dict()))
"""


def test_system_cpu_of_a_short_busy_run_covers_the_process_share():
    """The process is part of the system: its CPU, in cores, cannot be above the system's busy cores.
    The sampler's first sample used to read system CPU from two back-to-back readings (0.0 while the
    busy threads left the GIL free, as in every training run): psutil keeps its reference point per
    thread. A fresh process, as in a real run. The loop gets what the machine gives it (7.8% of a core
    in the first sample when others kept both cores busy): the comparison can fail as long as the
    process was seen working at all, which half a second of samples sees on any machine."""
    done = subprocess.run([sys.executable, "-c", BUSY_RUN], capture_output=True, text=True, timeout=60, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    cores, first = report["cores"], report["samples"][0]
    assert first["process_percent"] > 0  # the loop was seen working: a system reading of 0.0 would fail below
    assert first["system_percent"] * cores >= 0.8 * first["process_percent"]
    cpu = report["cpu"]
    assert cpu["system_mean_percent"] * cores >= 0.8 * cpu["process_mean_percent"]


IDLE_RUN = """
import json, time
from stallscope.workload.resources import ResourceMonitor
with ResourceMonitor(interval_s=0.1) as monitor:
    time.sleep(1.0)
print(json.dumps(monitor.report.summary()))
"""
BURN = "import hashlib, time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: hashlib.sha256(bytes(1 << 20)).digest()"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin a process and a load apart")
def test_a_pinned_process_counts_only_its_own_cpus():
    """Under taskset (or a container's cpuset) the monitor's cores are the CPUs the process may use,
    and the load on other CPUs is not its business: an idle run on CPU A beside a busy one on CPU B
    reads 1 core, nearly idle (the machine-wide figure read it 50% busy, 'other cores' 1 busy)."""
    mine, other = sorted(os.sched_getaffinity(0))[:2]
    burner = subprocess.Popen([sys.executable, "-c", BURN], preexec_fn=lambda: os.sched_setaffinity(0, {other}))
    try:
        time.sleep(0.3)
        before = _busy_jiffies()
        done = subprocess.run([sys.executable, "-c", IDLE_RUN], capture_output=True, text=True, timeout=60, check=True,
                              preexec_fn=lambda: os.sched_setaffinity(0, {mine}))
        after = _busy_jiffies()
    finally:
        burner.kill()
        burner.wait(10)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["cores"] == 1 and summary["cpus"] == 1
    share = {cpu: (after[cpu][0] - before[cpu][0]) / max(1, after[cpu][1] - before[cpu][1]) * 100 for cpu in (mine, other)}
    if share[other] - share[mine] < 50:  # other work on this machine kept CPU `mine` busy too
        pytest.skip(f"CPU {mine} was {share[mine]:.0f}% busy beside the load's {share[other]:.0f}%: too busy to tell apart")
    assert summary["system_mean_percent"] < 30
    assert abs(summary["system_mean_percent"] - share[mine]) < 25  # its own CPU's figure, not the machine's


def _busy_jiffies() -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies of each CPU from /proc/stat."""
    found = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            values = [int(v) for v in fields[:8]]
            idle = values[3] + values[4]  # idle + iowait
            found[int(name[3:])] = (sum(values) - idle, sum(values))
    return found


def test_a_run_too_short_to_sample_says_unknown_not_zero():
    """A run shorter than half an interval takes no sample: the machine's share is unknown (None, and
    'not sampled' on train's screen), and the process's own share comes from its CPU time."""
    from stallscope.cli.train import cpu_line

    with ResourceMonitor(interval_s=30.0) as monitor:
        ends = time.process_time() + 0.05
        while time.process_time() < ends:  # 50 ms of this process's CPU, well under one interval
            sum(range(1000))
    summary = monitor.report.summary()
    assert summary["samples"] == 0
    assert summary["system_mean_percent"] is None and summary["system_max_percent"] is None
    assert summary["process_mean_percent"] == pytest.approx(
        100 * summary["process_cpu_seconds"] / summary["duration_s"])
    assert summary["process_mean_percent"] > 0
    line = cpu_line(summary)
    assert line.startswith("not sampled (a run of ") and "0%" not in line.split(";")[0]


def test_the_cpu_line_speaks_one_unit():
    """Machine and process both in cores: the machine's share is of the run's cores, the process's of one
    core ('74% of 2 cores (process 147%)' mixed the two)."""
    from stallscope.cli.train import cpu_line

    line = cpu_line({"system_mean_percent": 74.0, "process_mean_percent": 147.0, "cores": 2, "cpus": 2,
                     "quota_cores": None, "duration_s": 10.0})
    assert line == "1.48 of 2 cores busy (this process 1.47)"
    assert "%" not in line
