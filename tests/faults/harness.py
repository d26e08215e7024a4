"""One harness for every hostile scenario: the real CLI as a child process, watched from launch to end.

Each scenario gets the same five checks: its exit code, how many lines it printed (an error is one
line), no Python traceback, a bounded time to fail, and no process left behind. The process tree is
sampled while the command runs (a killed parent's children are re-parented and vanish from its tree),
and after it ends every process seen, and any process whose command line names the scenario's
folder, must be gone within GONE_WITHIN_S. What survives is listed as an orphan, then ended by PID so
one failure does not spoil the next scenario.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

GONE_WITHIN_S = 5.0  # after the command ends, its children have this long to end too
SAMPLE_S = 0.02
TRACEBACK = "Traceback (most recent call last)"


@dataclasses.dataclass
class Outcome:
    """What one run of a scenario did, for its test and the session's table."""

    scenario: str
    rc: int | None  # None: it had to be killed at its limit (a hang)
    stdout: str
    stderr: str
    seconds: float  # from the launch, or from the stop signal where one was sent, to the exit
    orphans: list[str]

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    @property
    def stdout_lines(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.strip()]

    @property
    def traceback(self) -> bool:
        return TRACEBACK in self.stderr or TRACEBACK in self.stdout

    def check(self, *, rc: int, within_s: float, stderr_lines: int | None = 1) -> None:
        """The five promises: exit code `rc`, `stderr_lines` lines on stderr (None: not counted), no
        traceback, ended within `within_s`, nothing left running."""
        shown = f"{self.scenario}: stderr {self.stderr[-3000:]!r}"
        assert self.rc == rc, f"exit {self.rc}, expected {rc}; {shown}"
        if stderr_lines is not None:
            assert len(self.stderr_lines) == stderr_lines, shown
        assert not self.traceback, shown
        assert self.seconds <= within_s, f"{self.scenario}: took {self.seconds:.1f} s, promised {within_s:g} s"
        assert self.orphans == [], f"{self.scenario}: left running: {self.orphans}"


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {' '.join(process.cmdline())[:160]}"
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return str(process.pid)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def naming(folder: Path) -> list[psutil.Process]:
    """Running processes whose command line names `folder` or a path below it, other than this test
    process and what it started and still holds (a store the test serves; the command under watch is
    followed through its tree): what is left is some command's process that was re-parented."""
    needle = str(folder)
    found = []
    own = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
    for process in psutil.process_iter(["pid", "cmdline"]):
        if process.pid in own:
            continue
        cmdline = process.info.get("cmdline") or []
        if any(needle in part for part in cmdline) and _running(process):
            found.append(process)
    return found


class Launched:
    """A running CLI command under watch; `finish()` gives its Outcome."""

    def __init__(self, scenario: str, argv: list[str], folder: Path, record: Callable[[Outcome], None], *,
                 env: dict[str, str] | None = None, cwd: Path | None = None, new_session: bool = False) -> None:
        self.scenario, self.folder, self._record = scenario, folder, record
        already = naming(folder)
        assert not already, f"{scenario}: processes naming {folder} before the launch: {list(map(_describe, already))}"
        logs = folder / ".fault-logs"
        logs.mkdir(exist_ok=True)
        slug = "".join(c if c.isalnum() else "-" for c in scenario)
        self._out, self._err = logs / f"{slug}.stdout", logs / f"{slug}.stderr"
        child_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        child_env.update(env or {})
        with open(self._out, "wb") as out, open(self._err, "wb") as err:
            self.process = subprocess.Popen([sys.executable, "-m", "stallscope", *map(str, argv)], stdout=out,
                                            stderr=err, stdin=subprocess.DEVNULL, env=child_env, cwd=cwd,
                                            start_new_session=new_session)
        self.started = time.monotonic()
        self.stopped_at: float | None = None
        self.seen: dict[int, psutil.Process] = {}
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True, name=f"tree-{scenario}")
        self._sampler.start()

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.process.pid)
        except psutil.NoSuchProcess:
            return
        while not self._done.is_set() and self.process.poll() is None:
            try:
                for child in root.children(recursive=True):
                    self.seen.setdefault(child.pid, child)
            except psutil.NoSuchProcess:
                return
            time.sleep(SAMPLE_S)

    def children(self) -> list[psutil.Process]:
        """The command's descendants that run now."""
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Polls `condition` until it holds; fails naming `what` if the command ends or time runs out first."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"{self.scenario}: the command ended (exit {self.process.returncode}) before "
                                     f"{what}; stderr: {self._err.read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.scenario}: no {what} within {timeout_s:g} s")
            time.sleep(SAMPLE_S / 4)

    def stdout_so_far(self) -> str:
        return self._out.read_text(errors="replace")

    def send(self, sig: int, *, group: bool = False) -> None:
        """`sig` to the command (its whole process group, as a terminal's Ctrl-C, with `group`); the time
        to fail counts from here."""
        for child in self.children():
            self.seen.setdefault(child.pid, child)
        self.stopped_at = time.monotonic()
        (os.killpg if group else os.kill)(self.process.pid, sig)

    def finish(self, limit_s: float) -> Outcome:
        """Waits up to `limit_s` for the command to end (killing it there: rc None, a hang), then for
        every process it started; records and returns the Outcome."""
        try:
            self.process.wait(timeout=limit_s)
            rc: int | None = self.process.returncode
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            rc = None
        ended = time.monotonic()
        self._done.set()
        self._sampler.join(5)
        watched = [p for p in self.seen.values() if _running(p)] + naming(self.folder)
        _, alive = psutil.wait_procs(watched, timeout=GONE_WITHIN_S)
        survivors = {p.pid: p for p in alive if _running(p)}
        orphans = [_describe(p) for p in survivors.values()]
        for process in survivors.values():  # recorded; ended so the next scenario starts clean
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        outcome = Outcome(self.scenario, rc, self._out.read_text(errors="replace"),
                          self._err.read_text(errors="replace"), ended - (self.stopped_at or self.started), orphans)
        self._record(outcome)
        return outcome


def end_unfinished(*launched: "Launched | None") -> None:
    """A test that failed half-way leaves no server of its own behind: each launch still running is killed."""
    for run in launched:
        if run is not None and run.process.poll() is None:
            run.process.kill()
            run.process.wait(30)


def dispatcher_target(run: "Launched") -> str | None:
    """The grpc:// target a `serve dispatcher` printed ("tf.data service dispatcher at TARGET; ..."), once it has."""
    words = run.stdout_so_far().split()
    return words[4].rstrip(";") if len(words) > 4 and words[:4] == ["tf.data", "service", "dispatcher", "at"] else None


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """{relative path: (size, sha256)} of every file below `folder`: what the user had."""
    files = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and not path.is_symlink():
            files[str(path.relative_to(folder))] = (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    return files
