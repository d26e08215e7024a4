"""The storage emulator's Python API: a local folder as gs://, s3:// or a slow mount, for what-ifs,
sweeps and tests.

    from stallscope.storage.emulator import emulate

    with emulate("data", kind="gcs", latency_s=0.01, bandwidth_bps=200e6) as store:
        subprocess.run([...], env={**os.environ, **store.env})   # reads store.url, e.g. gs://data/train
        print(store.counters())                                   # live: requests, connections, bytes

The store runs in a child process (`stallscope storage serve`, the same command users run), so a
test can end it by its PID and a store never outlives its owner: it stops at `max_duration_s`, when
its parent dies, or at the end of the `with` block.

TensorFlow reads its gs:// settings when it first opens a gs:// path, so a TF reader in the calling
process must see `store.env` in os.environ before that (or run in a subprocess with it). The HTTP stores
refuse writes unless started `writable=True` (then uploads, copies and deletes land in the folder).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from stallscope.errors import UsageError
from stallscope.storage.emulator.counters import SharedCounters, StoreCounters
from stallscope.storage.emulator.serving import StoreOptions
from stallscope.storage.emulator.state_dirs import new_state_dir

log = logging.getLogger(__name__)

DEFAULT_MAX_DURATION_S = 3600.0
START_TIMEOUT_S = 30.0


class EmulatedStore:
    """A running emulated store (see `emulate`).

    url: 'gs://BUCKET', 's3://BUCKET' or the mount's path. env: the variables a reader needs.
    pid: the serving process. port: the port readers connect to (0 for a mount). server_port: the
    store's own port, behind the latency proxy where one runs (else the same as port).
    """

    def __init__(self, process: subprocess.Popen, info: dict, state_dir: Path, owns_state: bool,
                 log_path: Path) -> None:
        self.process = process
        self.pid = process.pid
        self.kind: str = info["kind"]
        self.url: str = info["url"]
        self.env: dict[str, str] = dict(info["env"])
        self.port: int = int(info.get("port") or 0)
        self.server_port: int = int(info.get("server_port") or 0)
        self.root = Path(info["root"])
        self._state_dir, self._owns_state, self._log_path = state_dir, owns_state, log_path
        self._counters = SharedCounters(info["counters_map"], create=False)
        self._final: StoreCounters | None = None

    def counters(self) -> StoreCounters:
        """What the store has done so far (live while it runs; the final numbers after stop)."""
        return self._final if self._final is not None else self._counters.snapshot()

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 15.0) -> StoreCounters:
        """Ends the store (SIGTERM: a mount is unmounted), then SIGKILL if it does not end in time."""
        if self._final is not None:
            return self._final
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("storage emulator %d did not stop in %g s; killing it", self.pid, timeout_s)
                self.process.kill()
                self.process.wait(timeout_s)
        self._final = self._counters.snapshot()
        self._counters.close()
        if self._owns_state:
            shutil.rmtree(self._state_dir, ignore_errors=True)
        return self._final

    def apply_env(self) -> None:
        """Puts `env` into os.environ (for a reader in this process; TF's gs:// must not be used yet)."""
        os.environ.update(self.env)

    def __repr__(self) -> str:
        return f"EmulatedStore(kind={self.kind!r}, url={self.url!r}, pid={self.pid}, port={self.port})"


def start(root: str | os.PathLike, kind: str = "gcs", *, latency_s: float = 0.0,
          bandwidth_bps: float | None = None, bucket: str = "data", mount_point: str | os.PathLike | None = None,
          port: int = 0, writable: bool = False, max_duration_s: float = DEFAULT_MAX_DURATION_S, counters_path: str | os.PathLike | None = None,
          start_timeout_s: float = START_TIMEOUT_S) -> EmulatedStore:
    """Starts a store and returns once it answers; the caller stops it (`emulate` does that for you).

    Raises UsageError with the serve command's one line when it cannot start (folder missing, port
    taken, mount point not empty, no FUSE)."""
    options = StoreOptions(root=Path(root), kind=kind, latency_s=float(latency_s), bandwidth_bps=bandwidth_bps,
                           bucket=bucket, mount_point=Path(mount_point) if mount_point is not None else None,
                           port=int(port), writable=writable)
    state_dir = new_state_dir()
    ready, log_path = state_dir / "ready.json", state_dir / "serve.log"
    command = [sys.executable, "-m", "stallscope", "storage", "serve", str(options.root),
               "--latency", f"{options.latency_s * 1000:.6f}ms", "--bucket", options.bucket, "--port", str(options.port),
               "--for", f"{float(max_duration_s):.3f}s", "--ready-file", str(ready), "--state-dir", str(state_dir),
               "--parent-pid", str(os.getpid())]
    command += ["--mount", str(options.mount_point)] if kind == "mount" else [f"--{kind}"]
    if writable:
        command += ["--writable"]
    if bandwidth_bps:
        command += ["--bandwidth", f"{float(bandwidth_bps):.3f}bit"]
    if counters_path is not None:
        command += ["--counters", str(counters_path)]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                   env=_child_env(), start_new_session=True)
    deadline = time.monotonic() + start_timeout_s
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            text = log_path.read_text(errors="replace") if log_path.exists() else ""
            shutil.rmtree(state_dir, ignore_errors=True)
            lines = [line for line in text.splitlines() if "error:" in line] or text.splitlines()[-1:]
            why = lines[-1].split("error: ", 1)[-1] if lines else f"it did not answer within {start_timeout_s:g} s"
            raise UsageError(why)
        time.sleep(0.02)
    return EmulatedStore(process, json.loads(ready.read_text()), state_dir, True, log_path)


@contextlib.contextmanager
def emulate(root: str | os.PathLike, kind: str = "gcs", **options) -> Iterator[EmulatedStore]:
    """`start(...)` as a context manager: the store is stopped (and a mount unmounted) on exit.
    Options: latency_s, bandwidth_bps, bucket, mount_point, port, writable, max_duration_s, counters_path."""
    store = start(root, kind, **options)
    try:
        yield store
    finally:
        store.stop()


def _child_env() -> dict[str, str]:
    """The child imports this very stallscope (a worktree's src/ wins, as in the parent)."""
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    return env
