"""Runs a command while busy processes keep some of this machine's cores busy: the suite under load.

A test whose outcome flips when the machine is slow or shared (a verdict of a live run, a deadline)
passes on a quiet machine and fails on a user's busy one. `make test-loaded` runs the whole suite
through this, one core kept busy, to show that none does. The hogs are this process's own children:
started before the command, ended by their PIDs after it, and told by the kernel to die with this
process should it be killed first (so nothing spins on after a stopped run). Their PIDs are in the
command's environment as STALLSCOPE_CPU_HOG_PIDS.

usage: python tools/cpu_hog.py [--cores N] -- COMMAND [ARG ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

HOG_PIDS_ENV = "STALLSCOPE_CPU_HOG_PIDS"
# A busy loop that also ends itself should its parent be gone without the kernel's signal (off Linux).
HOG_CODE = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(10**6): pass\n"
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the forked hog, before it runs: SIGKILL when this process ends (Linux), however it ends."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def start_hogs(cores: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", HOG_CODE], preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)
            for _ in range(cores)]


def end_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait(timeout=30)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cpu_hog.py", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--cores", type=int, default=1, help="how many cores to keep busy (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.cores < 1:
        parser.error("expected --cores of 1 or more and a command after --")
    hogs = start_hogs(args.cores)
    print(f"cpu_hog: {args.cores} core(s) kept busy by PID {', '.join(str(h.pid) for h in hogs)} while the "
          "command runs", file=sys.stderr, flush=True)
    env = dict(os.environ, **{HOG_PIDS_ENV: ",".join(str(h.pid) for h in hogs)})
    try:
        return subprocess.call(command, env=env)
    except KeyboardInterrupt:
        return 130
    finally:
        end_hogs(hogs)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
