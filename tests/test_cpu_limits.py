"""The CPU a process may use: affinity and the cgroup's quota, read as the kernel exposes them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope import cpu_limits
from stallscope.config import usable_cores
from stallscope.cpu_limits import CpuLimits, Throttling, quota_throttled, throttling
from stallscope.workload.resources import share_busy

# CPU shares and quota throttling, measured: another test beside it would take the CPU they count.
pytestmark = pytest.mark.whole_machine


def _quota(root: Path) -> float | None:
    return cpu_limits.current(root).quota_cores


def _tree(root: Path, cgroup: str, mountinfo: str, quotas: dict[str, str]) -> Path:
    """A file system root with /proc/self/cgroup, /proc/self/mountinfo and the given cgroup files."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/self/mountinfo").write_text(mountinfo)
    for path, text in quotas.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_cgroup_v2_the_least_quota_up_the_hierarchy_wins(tmp_path):
    root = _tree(tmp_path, "0::/kubepods/pod1/ctr\n", V2_MOUNT, {
        "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "max 100000\n",       # no limit of its own
        "sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000\n",       # the pod's limit: 1.5 CPUs
        "sys/fs/cgroup/kubepods/cpu.max": "800000 100000\n",
    })
    assert _quota(root) == 1.5


def test_cgroup_v2_without_a_quota(tmp_path):
    root = _tree(tmp_path, "0::/user.slice\n", V2_MOUNT, {"sys/fs/cgroup/user.slice/cpu.max": "max 100000\n"})
    assert _quota(root) is None


def test_cgroup_v1_container_whose_mount_shows_only_its_own_part(tmp_path):
    """Docker without a cgroup namespace: the path names the host's hierarchy, the mount's root is it."""
    mountinfo = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
                 "35 31 0:32 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
                 "36 31 0:33 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    root = _tree(tmp_path, "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n", mountinfo, {
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert _quota(root) == 2.0


def test_throttling_counters_of_the_quota_s_own_cgroup(tmp_path):
    """The counters come from the cgroup whose quota is the least (v2 in microseconds, v1 in ns)."""
    root = _tree(tmp_path / "v2", "0::/pod/ctr\n", V2_MOUNT, {
        "sys/fs/cgroup/pod/ctr/cpu.max": "max 100000\n", "sys/fs/cgroup/pod/cpu.max": "50000 100000\n",
        "sys/fs/cgroup/pod/cpu.stat": "usage_usec 9\nnr_periods 40\nnr_throttled 10\nthrottled_usec 1500000\n"})
    limits = cpu_limits.current(root)
    assert limits.quota_cores == 0.5 and limits.quota_stat.endswith("pod/cpu.stat")
    assert throttling(limits) == Throttling(40, 10, 1.5)
    root = _tree(tmp_path / "v1", "4:cpu:/job\n", "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", {
        "sys/fs/cgroup/cpu/job/cpu.cfs_quota_us": "150000\n", "sys/fs/cgroup/cpu/job/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpu/job/cpu.stat": "nr_periods 8\nnr_throttled 2\nthrottled_time 250000000\n"})
    counted = throttling(cpu_limits.current(root))
    assert counted == Throttling(8, 2, 0.25) and counted.since(Throttling(4, 2, 0.25)).throttled_share == 0.0
    assert throttling(CpuLimits(cpus=(0,))) is None  # no quota, nothing to count


def test_unreadable_or_absent_cgroups_mean_no_quota(tmp_path):
    assert _quota(tmp_path) is None  # no /proc at all
    root = _tree(tmp_path / "v1", "4:cpu:/\n", "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", {
        "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"})
    assert _quota(root) is None
    root = _tree(tmp_path / "bad", "0::/a\n", V2_MOUNT, {"sys/fs/cgroup/a/cpu.max": "lots 100000\n"})
    assert _quota(root) is None


def test_capacity_whole_cores_and_what_others_take():
    pinned = CpuLimits(cpus=(3,))
    assert pinned.capacity == 1 and pinned.whole_cores == 1
    assert pinned.busy_by_others(busy_on_cpus=1.0, own_busy=0.25) == 0.75
    quota = CpuLimits(cpus=tuple(range(8)), quota_cores=1.5)
    assert quota.capacity == 1.5 and quota.whole_cores == 2
    assert quota.busy_by_others(busy_on_cpus=4.0, own_busy=1.0) == 0.0   # 5 idle CPUs: the quota is the limit
    assert quota.busy_by_others(busy_on_cpus=7.5, own_busy=1.0) == 0.0
    assert quota.busy_by_others(busy_on_cpus=8.0, own_busy=1.0) == 0.5   # others leave it half a CPU short
    assert CpuLimits(cpus=(0, 1), quota_cores=0.5).whole_cores == 1
    assert CpuLimits(cpus=(0, 1), quota_cores=4.0).capacity == 2       # a quota above the CPUs does not add any


def test_a_quota_in_words():
    assert cpu_limits.cpus_worth(1) == "1 CPU's worth"
    assert cpu_limits.cpus_worth(0.5) == "0.5 CPUs' worth"
    assert cpu_limits.cpus_worth(2.0) == "2 CPUs' worth"


def test_share_busy_counts_the_process_cpus_only():
    per_cpu = (100.0, 20.0, 100.0, 100.0)
    assert share_busy(CpuLimits(cpus=(1,)), per_cpu, process_percent=20.0) == pytest.approx(20.0)
    assert share_busy(CpuLimits(cpus=(0, 1, 2, 3)), per_cpu, process_percent=20.0) == pytest.approx(80.0)
    # a 1-CPU quota over 4 CPUs, 0.2 of them its own: 0.8 idle is all the quota has left, not short
    assert share_busy(CpuLimits(cpus=(0, 1, 2, 3), quota_cores=1.0), per_cpu, process_percent=20.0) == pytest.approx(20.0)
    # with 0.5 idle, others keep 0.3 of the quota from it
    tighter = (100.0, 50.0, 100.0, 100.0)
    assert share_busy(CpuLimits(cpus=(0, 1, 2, 3), quota_cores=1.0), tighter, process_percent=20.0) == pytest.approx(50.0)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin a process to one")
def test_affinity_sets_usable_cores():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    code = "from stallscope.config import usable_cores; from stallscope import cpu_limits; print(usable_cores(), cpu_limits.current().cpus)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    assert done.stdout.split(None, 1) == ["1", f"({cpu},)\n"]
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_a_real_cgroup_quota_limits_usable_cores(cpu_cgroup):
    """A child process moved into a fresh cgroup with half a CPU's quota sees it: one worker, 0.5 capacity."""
    cpu_cgroup.limit(0.5)
    code = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()));"
            "from stallscope import cpu_limits; limits = cpu_limits.current();"
            "print(limits.quota_cores, limits.capacity, limits.whole_cores)")
    done = subprocess.run([sys.executable, "-c", code, str(cpu_cgroup.procs)], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.split() == ["0.5", "0.5", "1"]


BUSY_UNDER_QUOTA = """
import hashlib, json, sys, time
open(sys.argv[1], "w").write(__import__("os").getpid().__str__())
from stallscope.workload.resources import ResourceMonitor
with ResourceMonitor(interval_s=0.1) as monitor:
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        hashlib.sha256(bytes(1 << 16)).digest()
print(json.dumps(monitor.report.summary()))
"""


def test_a_busy_run_under_a_small_quota_is_reported_throttled(cpu_cgroup):
    """A process that wants a whole CPU under a fifth of one waits in most periods: the run's CPU summary
    says so, and the quota, not the CPUs, is named as the limit."""
    cpu_cgroup.limit(0.2)
    done = subprocess.run([sys.executable, "-c", BUSY_UNDER_QUOTA, str(cpu_cgroup.procs)],
                          capture_output=True, text=True, timeout=120, check=True)
    cpu = json.loads(done.stdout.strip().splitlines()[-1])
    assert cpu["quota_cores"] == 0.2 and cpu["cores"] == 0.2
    assert cpu["throttled_share"] > 0.5 and cpu["throttled_s"] > 0.5
    assert cpu["system_mean_percent"] > 80  # the quota's worth of CPU was all in use
    assert "the quota of 0.2 CPUs, not the CPUs, limited it" in quota_throttled(cpu)
