"""A profile captured from a running job, as TensorBoard's "Capture profile" button takes one.

The job serves its profiler with one line, `stallscope.serve_profiler(PORT)` (this machine only) or TF's
`tf.profiler.experimental.server.start(PORT)` (every interface, no authentication).
TF's client (`tf.profiler.experimental.client.trace`) waits on its own clock (20 s to connect per
attempt, a 60 s session) and prints to stdout, so it runs in a child process that is killed at our
deadline; the port is tried first, so a job that is not there is named at once, and so is one that
accepts connections but does not answer (its gRPC server would answer an HTTP/2 greeting at once; TF's
client waited 20 s on such a port and then said the job "recorded nothing"). One attempt: TF's
retries would stretch a capture past the window the user asked for. Each capture is
written to a hidden staging folder and moved to `LOG_PATH/plugins/profile/<time>/` only when
complete; a failed or interrupted capture leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stallscope.errors import StallscopeError, UsageError
from stallscope.service.servers import normalize_address
from stallscope.workload.rundir import PROFILE_DIR

log = logging.getLogger(__name__)

STAGING_PREFIX = ".capture-partial-"
_CONNECT_TIMEOUT_S = 5.0
_FAILED = "capture failed: "  # the child's last stderr line when TF's client raised
# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server answers with its own SETTINGS.
_HTTP2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS_FRAME = 0x4


class CaptureError(StallscopeError):
    """The job did not answer, stopped answering, or the capture cannot be used."""


class JobUnreachable(CaptureError):
    """Nothing answers at the address, or it stopped answering: watching cannot go on."""


class NoSteps(CaptureError):
    """The job answered but the window holds nothing to analyse (it may be between steps)."""


@dataclasses.dataclass(frozen=True)
class CaptureOptions:
    """address: HOST:PORT of the job's profiler server; duration_s: the window traced;
    timeout_s: how long past the window to wait for the job's answer before giving up."""

    address: str
    log_path: Path
    duration_s: float = 5.0
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", normalize_address(str(self.address), "HOST:PORT"))
        object.__setattr__(self, "log_path", Path(self.log_path))
        if not self.duration_s >= 0.001:
            raise UsageError(f"--duration: expected at least 1ms, got {self.duration_s!r}s")
        if not self.timeout_s > 0:
            raise UsageError(f"--timeout: expected a time above 0, got {self.timeout_s!r}s")
        if self.log_path.exists() and not self.log_path.is_dir():
            raise UsageError(f"--log-path: {str(self.log_path)!r} is a file; expected a directory")

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.address[len("grpc://"):].rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def display(self) -> str:
        return self.address[len("grpc://"):]


def check_listening(options: CaptureOptions) -> None:
    """Raises JobUnreachable when nothing accepts a connection at the address, or what accepts it does
    not answer an HTTP/2 greeting as a gRPC server does."""
    host, port = options.host_port
    wait = min(options.timeout_s, _CONNECT_TIMEOUT_S)
    try:
        with socket.create_connection((host, port), timeout=wait) as connection:
            _check_answers(connection, options, wait)
            return
    except ConnectionRefusedError:
        raise JobUnreachable(
            f"{options.display}: nothing listens there (connection refused); start the job's profiler server "
            f"with stallscope.serve_profiler({port}), which keeps it to this machine "
            f"(tf.profiler.experimental.server.start({port}) listens on every interface, unauthenticated)"
        ) from None
    except TimeoutError:
        raise JobUnreachable(f"{options.display}: no answer to a connection within "
                             f"{min(options.timeout_s, _CONNECT_TIMEOUT_S):g}s (--timeout)") from None
    except OSError as exc:
        raise JobUnreachable(f"{options.display}: cannot connect ({exc.strerror or exc})") from None


def _check_answers(connection: socket.socket, options: CaptureOptions, wait: float) -> None:
    """The peer's first frame, within `wait` seconds of greeting it: a gRPC server's SETTINGS."""
    try:
        connection.sendall(_HTTP2_GREETING)
        answer = b""
        deadline = time.monotonic() + wait
        while len(answer) < 9:  # a frame header: length (3), type (1), flags (1), stream (4)
            connection.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = connection.recv(9 - len(answer))
            if not chunk:
                break
            answer += chunk
    except TimeoutError:
        raise JobUnreachable(
            f"{options.display}: the job accepts connections but does not answer (no reply to a gRPC greeting "
            f"within {wait:g}s); is its profiler server stuck, or is another program on this port?") from None
    except OSError as exc:
        raise JobUnreachable(f"{options.display}: the connection was dropped ({exc.strerror or exc})") from None
    if len(answer) < 9 or answer[3] != _SETTINGS_FRAME:
        raise JobUnreachable(f"{options.display}: what listens there is not a profiler server (it did not answer "
                             "as gRPC does); expected the job's stallscope.serve_profiler(PORT)")


def capture(options: CaptureOptions) -> Path:
    """Captures one window of the live job; returns its capture directory under log_path."""
    check_listening(options)
    created = not options.log_path.exists()
    options.log_path.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=options.log_path))
    try:
        _run_client(options, staging)
        return _move_into_place(options, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not any(options.log_path.iterdir()):  # made here, and no capture came
            options.log_path.rmdir()


def _run_client(options: CaptureOptions, staging: Path) -> None:
    duration_ms = max(1, round(options.duration_s * 1000))
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    command = [sys.executable, "-m", __name__, options.address, str(staging), str(duration_ms)]
    log.info("capturing %d ms from %s", duration_ms, options.display)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=env, text=True, errors="replace")
    deadline = options.duration_s + options.timeout_s
    try:
        _, stderr = child.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        raise JobUnreachable(
            f"{options.display}: no capture within {deadline:g}s ({options.duration_s:g}s window + "
            f"{options.timeout_s:g}s --timeout); the job accepts connections but does not answer"
        ) from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode == 0:
        return
    failed = [line[len(_FAILED):] for line in stderr.splitlines() if line.startswith(_FAILED)]
    log.info("profiler client said: %s", stderr.strip()[-2000:])
    try:
        check_listening(options)
    except JobUnreachable:
        raise JobUnreachable(f"{options.display}: the job stopped answering during the capture "
                             "(its profiler server is gone; did the job end?)") from None
    if failed and "No trace event was collected" in failed[-1]:
        raise NoSteps(f"{options.display}: the job answered but recorded nothing in the "
                      f"{options.duration_s:g}s window (is it running steps?)")
    detail = failed[-1] if failed else f"the profiler client exited with code {child.returncode}"
    raise CaptureError(f"{options.display}: capture failed: {detail}")


def _move_into_place(options: CaptureOptions, staging: Path) -> Path:
    """The complete capture (plugins/profile/<time>/) moved from staging to log_path."""
    written = sorted(p.parent for p in (staging / PROFILE_DIR).glob("*/*.xplane.pb"))
    if not written:
        raise NoSteps(f"{options.display}: the job answered but wrote no profile for the "
                      f"{options.duration_s:g}s window")
    source = written[-1]
    target_parent = options.log_path / PROFILE_DIR
    target_parent.mkdir(parents=True, exist_ok=True)
    target, n = target_parent / source.name, 1
    while target.exists():  # two captures within one second share TF's timestamp name
        n += 1
        target = target_parent / f"{source.name}_{n}"
    source.rename(target)
    return target


def default_log_path(now: datetime.datetime | None = None) -> Path:
    """A new directory name for the captures: capture-YYYYmmdd-HHMMSS."""
    return Path(f"capture-{(now or datetime.datetime.now()).strftime('%Y%m%d-%H%M%S')}")


def _client_main(argv: list[str]) -> int:
    """The child: TF's profiler client, its error reduced to one line for the parent."""
    address, logdir, duration_ms = argv
    try:
        _profiler_trace(address, logdir, int(duration_ms))
    except Exception as exc:  # TF raises RuntimeError or its own errors from C++
        message = " ".join(str(exc).split())
        print(f"{_FAILED}{type(exc).__name__}: {message}", file=sys.stderr, flush=True)
        return 1
    return 0


def _profiler_trace(address: str, logdir: str, duration_ms: int) -> None:
    """`tf.profiler.experimental.client.trace` with one attempt. Its extension module is loaded from
    its file when it is there: it needs only TF's shared libraries, not TensorFlow's package init
    (seconds per capture). Otherwise the public call is used."""
    spec = importlib.util.find_spec("tensorflow")
    folder = Path(list(spec.submodule_search_locations)[0]) / "python" / "profiler" / "internal" if spec else None
    files = sorted(folder.glob("_pywrap_profiler_plugin*.so")) if folder and folder.is_dir() else []
    if not files:
        from stallscope.tfimport import import_tensorflow

        import_tensorflow().profiler.experimental.client.trace(address, logdir, duration_ms, num_tracing_attempts=1)
        return
    module_spec = importlib.util.spec_from_file_location("_pywrap_profiler_plugin", files[0])
    plugin = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(plugin)
    # The arguments TF's public `trace` passes: no grpc:// prefix, no TPU worker list, dataset ops on.
    plugin.trace(address.removeprefix("grpc://"), logdir, "", True, duration_ms, 1, {})


if __name__ == "__main__":
    raise SystemExit(_client_main(sys.argv[1:]))
