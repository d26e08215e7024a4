"""Runs a command in a fresh cgroup with a CPU quota, as a container's `--cpus` or a pod's CPU limit
would, prints how often the quota ran out, and removes the cgroup after. The README's CPU-quota
figures were measured this way; the tests and benchmarks/cpu_quota.py make their cgroups with it.

It takes root and a cgroup CPU controller (v2 with `cpu` in the root's subtree_control, or v1's cpu
hierarchy); where there is none, it says so in one line and exits 2.

usage: python tools/cpu_cgroup.py --cpus 1.0 -- COMMAND [ARG ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout, as the benchmarks are

PERIOD_US = 100_000


class CpuCgroup:
    """A fresh cgroup with the CPU controller: `limit(cores)` sets its quota, `procs` is the file a
    process id is written to (to move that process in), `home` the file that moves it back out.
    `remove()` once its processes are gone or moved out."""

    def __init__(self, parent: Path, version: int) -> None:
        self.version = version
        self.folder = parent / f"stallscope-{uuid.uuid4().hex[:8]}"
        self.folder.mkdir()
        self.procs = self.folder / "cgroup.procs"
        self.home = parent / own_cgroup(version).lstrip("/") / "cgroup.procs"  # where this process is now

    def limit(self, cores: float) -> None:
        if self.version == 2:
            (self.folder / "cpu.max").write_text(f"{round(cores * PERIOD_US)} {PERIOD_US}")
        else:
            (self.folder / "cpu.cfs_quota_us").write_text(str(round(cores * PERIOD_US)))

    def throttling(self):
        """The quota's counters so far (stallscope.cpu_limits.Throttling), read as a run reads its own."""
        from stallscope.cpu_limits import CpuLimits, throttling

        return throttling(CpuLimits(cpus=(), quota_stat=str(self.folder / "cpu.stat")))

    def remove(self) -> None:
        self.folder.rmdir()


def own_cgroup(version: int) -> str:
    """This process's cgroup path in the v2 hierarchy, or in v1's cpu hierarchy."""
    for line in open("/proc/self/cgroup"):
        number, controllers, path = line.rstrip("\n").split(":", 2)
        if (version == 2 and number == "0") or (version == 1 and "cpu" in controllers.split(",")):
            return path
    return "/"


def writable_parent() -> tuple[Path, int] | None:
    """(the cgroup folder to make a child in, its version), or None where this process may not."""
    v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")
    if (v2 / "cgroup.controllers").exists():
        ok = "cpu" in (v2 / "cgroup.subtree_control").read_text().split() and os.access(v2, os.W_OK)
        return (v2, 2) if ok else None
    return (v1, 1) if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK) else None


def run_limited(cores: float, command: list[str]):
    """Runs `command` in a fresh cgroup of `cores` CPUs' quota: (its exit status, its Throttling)."""
    found = writable_parent()
    if found is None:
        raise PermissionError("no cgroup CPU hierarchy this process may create a child in (needs root)")
    group = CpuCgroup(*found)
    try:
        group.limit(cores)
        # the child moves itself in before exec, so every thread it starts is under the quota
        done = subprocess.run(command, preexec_fn=lambda: group.procs.write_text(str(os.getpid())))
        return done.returncode, group.throttling()
    finally:
        group.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=float, required=True, help="the quota, in CPUs' worth (0.5, 1, 1.5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not args.cpus > 0:
        parser.error("expected --cpus N (above 0) -- COMMAND [ARG ...]")
    try:
        code, held = run_limited(args.cpus, command)
    except (PermissionError, OSError) as exc:
        print(f"cpu_cgroup: {exc}", file=sys.stderr)
        return 2
    print(f"cpu_cgroup: a quota of {args.cpus:g} CPUs ran out in {held.throttled_share:.0%} of {held.periods} "
          f"periods, {held.throttled_s:.2f} s held back", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
