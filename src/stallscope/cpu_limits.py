"""The CPU this process may really use: its affinity (taskset, a container's cpuset) and its cgroup's
CPU quota (a container's `--cpus`, a Kubernetes pod's CPU limit). `os.cpu_count()` and
`psutil.cpu_count()` see neither: on a 64-core node with a 2-CPU limit, a pool sized to the machine
runs 64 workers on 2 CPUs' time, and a what-if counting 64 free cores predicts 32 times too high.

The quota is read from the cgroup file system as the kernel exposes it (v2 `cpu.max`, v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`), at the process's own cgroup and every level above it up to
the mount's root, the least one winning: a parent's limit holds for its children.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path

from stallscope import mountinfo

log = logging.getLogger(__name__)

QUOTA_SATURATED_SHARE = 0.2  # a quota that ran out in this share of its periods or more limits the run


def quota_limited(throttled_share: float | None) -> bool:
    """Whether a run's CPU quota, having run out in this share of its periods, was its limit (None: no quota)."""
    return isinstance(throttled_share, (int, float)) and throttled_share >= QUOTA_SATURATED_SHARE


def cpus_worth(cores: float) -> str:
    """A quota in words: "1 CPU's worth", "0.5 CPUs' worth"."""
    return f"{cores:g} CPU's worth" if cores == 1 else f"{cores:g} CPUs' worth"


@dataclasses.dataclass(frozen=True)
class CpuLimits:
    """cpus: the CPU numbers the scheduler may run this process on. quota_cores: the cgroup's CPU time
    per wall second (1.5 = one and a half CPUs' worth), None where no quota applies."""

    cpus: tuple[int, ...]
    quota_cores: float | None = None
    quota_stat: str | None = None  # the cpu.stat of the cgroup whose quota that is: its throttling counts

    @property
    def capacity(self) -> float:
        """CPUs' worth of time this process can get per second."""
        return min(float(len(self.cpus)), self.quota_cores) if self.quota_cores else float(len(self.cpus))

    @property
    def whole_cores(self) -> int:
        """Workers or threads to size a CPU-bound pool with: the capacity rounded up (a quota of 1.5 CPUs
        keeps two workers busy in turn), at least one."""
        return max(1, min(len(self.cpus), math.ceil(self.capacity - 1e-9)))

    def busy_by_others(self, busy_on_cpus: float, own_busy: float) -> float:
        """CPUs' worth of this process's capacity that other processes take, from how busy its CPUs were
        (in CPUs' worth, all processes) and how busy it kept them itself. Under a quota the others only
        get in the way once they leave fewer idle CPUs than the quota: the quota, not the spare CPUs,
        is then the limit."""
        others = max(0.0, busy_on_cpus - own_busy)
        spare = len(self.cpus) - self.capacity
        return min(self.capacity, max(0.0, others - spare))


def current(root: str | os.PathLike = "/") -> CpuLimits:
    """This process's limits now (the affinity can change under it: asked afresh each time). `root` is
    the file system root the cgroup files are read under."""
    if hasattr(os, "sched_getaffinity"):
        cpus = tuple(sorted(os.sched_getaffinity(0)))
    else:
        cpus = tuple(range(os.cpu_count() or 1))
    quota = least_cgroup_quota(Path(root))
    if quota is None:
        return CpuLimits(cpus=cpus)
    return CpuLimits(cpus=cpus, quota_cores=quota[0], quota_stat=str(quota[1] / "cpu.stat"))


def least_cgroup_quota(root: Path = Path("/")) -> tuple[float, Path] | None:
    """(the least CPU quota in CPUs on this process's cgroup path, the cgroup folder that sets it), v2
    first, then v1's cpu controller; None where none is set or the files cannot be read (not Linux, no
    cgroup mounted)."""
    try:
        memberships = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    quotas: list[tuple[float, Path]] = []
    for version, path in _cpu_cgroups(memberships):
        for mount_root, mount_point in _cgroup_mounts(mounts, version):
            folder = _folder_of(root, mount_root, mount_point, path)
            if folder is not None:
                quotas.extend(_quotas_up_to(folder, root / mount_point.lstrip("/"), version))
                break
    return min(quotas, key=lambda quota: quota[0]) if quotas else None


def _cpu_cgroups(memberships: list[str]) -> list[tuple[int, str]]:
    """(1 or 2, the cgroup path) of the hierarchies that hold the CPU controller, v2 first."""
    found = []
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            found.append((2, path))
        elif "cpu" in controllers.split(","):
            found.append((1, path))
    return sorted(found, key=lambda item: -item[0])


def _cgroup_mounts(mounts: list[str], version: int) -> list[tuple[str, str]]:
    """(the cgroup path at the mount's root, the mount point) of each cgroup2 mount, or each v1 mount
    of the cpu controller, from /proc/self/mountinfo."""
    found = []
    for mount in mountinfo.mounts("\n".join(mounts)):
        if mount.super_options is None:
            continue
        if ((version == 2 and mount.fstype == "cgroup2")
                or (version == 1 and mount.fstype == "cgroup" and "cpu" in mount.super_options)):
            found.append((mount.root, mount.point))
    return found


def _folder_of(root: Path, mount_root: str, mount_point: str, path: str) -> Path | None:
    """Where the cgroup `path` is under a mount of its hierarchy; None where the mount does not show it.
    In a container without its own cgroup namespace the path names the host's hierarchy while the
    mount shows only the container's part: its root then stands for the path."""
    base = root / mount_point.lstrip("/")
    mount_root = mount_root.rstrip("/")
    if mount_root and mount_root != "/" and path.startswith(mount_root + "/"):
        relative = path[len(mount_root):]
    elif mount_root in ("", "/"):
        relative = path
    elif path == mount_root:
        relative = "/"
    else:
        return None
    folder = base / relative.lstrip("/")
    if folder.is_dir():
        return folder
    return base if base.is_dir() else None


def _quotas_up_to(folder: Path, top: Path, version: int) -> list[tuple[float, Path]]:
    """The quotas set on `folder` and each parent up to `top`, in CPUs, each with its folder."""
    found = []
    while True:
        quota = _quota_in(folder, version)
        if quota is not None:
            found.append((quota, folder))
        if folder == top or top not in folder.parents:
            return found
        folder = folder.parent


def _quota_in(folder: Path, version: int) -> float | None:
    try:
        if version == 2:
            limit, _, period = (folder / "cpu.max").read_text().strip().partition(" ")
        else:
            limit = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    if limit in ("max", "-1") or not period:
        return None
    try:
        quota, span = int(limit), int(period)
    except ValueError:
        log.debug("unreadable CPU quota in %s: %r / %r", folder, limit, period)
        return None
    return quota / span if quota > 0 and span > 0 else None


@dataclasses.dataclass(frozen=True)
class Throttling:
    """The CFS bandwidth counters of a cgroup (cpu.stat): enforcement periods (100 ms by default),
    those in which the cgroup ran out of quota and waited, and the time its threads waited so."""

    periods: int
    throttled_periods: int
    throttled_s: float

    def since(self, earlier: "Throttling") -> "Throttling":
        return Throttling(self.periods - earlier.periods, self.throttled_periods - earlier.throttled_periods,
                          self.throttled_s - earlier.throttled_s)

    @property
    def throttled_share(self) -> float:
        """Share of the periods in which the quota ran out."""
        return self.throttled_periods / self.periods if self.periods else 0.0


def throttling(limits: CpuLimits) -> Throttling | None:
    """The quota's cgroup's counters now; None without a quota or where cpu.stat cannot be read. v2
    counts the wait in throttled_usec, v1 in throttled_time (ns)."""
    if not limits.quota_stat:
        return None
    try:
        fields = dict(line.split() for line in Path(limits.quota_stat).read_text().splitlines() if len(line.split()) == 2)
        waited = int(fields["throttled_usec"]) / 1e6 if "throttled_usec" in fields else int(fields["throttled_time"]) / 1e9
        return Throttling(int(fields["nr_periods"]), int(fields["nr_throttled"]), waited)
    except (OSError, KeyError, ValueError) as exc:
        log.debug("no CPU throttling counters in %s: %s", limits.quota_stat, exc)
        return None


def cpu_named(cpu: dict) -> str:
    """'2 cores', or '1.5 cores (a CPU quota, on 8 CPUs)', from a run's CPU summary (resources.json's "cpu");
    older runs, without "cpus", name the machine's cores they counted."""
    cores, cpus, quota = cpu.get("cores"), cpu.get("cpus"), cpu.get("quota_cores")
    if not isinstance(cores, (int, float)):
        return "cores (how many unknown)"
    text = f"{cores:g} core" + ("" if cores == 1 else "s")
    if quota is not None and cpus and quota < cpus:
        text += f" (a CPU quota, on {cpus} CPUs)"
    return text


def quota_throttled(cpu: dict) -> str | None:
    """What the cgroup's CPU quota cost a run, from its CPU summary: a stall no profile shows (the
    cgroup's threads just wait for the next period); None where it was never throttled."""
    waited, share, quota = cpu.get("throttled_s"), cpu.get("throttled_share"), cpu.get("quota_cores")
    if not waited or not isinstance(quota, (int, float)):
        return None
    duration = cpu.get("duration_s")
    of_run = f" over a {duration:.1f} s run" if isinstance(duration, (int, float)) and duration > 0 else ""
    cpus = f"{quota:g} CPU" + ("" if quota == 1 else "s")
    return (f"throttled in {share:.0%} of its periods, {waited:.2f} s held back{of_run}: "
            f"the quota of {cpus}, not the CPUs, limited it")
