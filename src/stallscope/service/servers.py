"""Starting tf.data service dispatchers and workers, in this process or as child processes.

When one host's CPUs cannot decode fast enough, the tf.data service runs the pipeline (read,
decode, resize, batch) on worker processes, possibly on other machines, and the training job only
receives finished batches. `PipelineConfig.data_service` points the builder at a dispatcher.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from stallscope.config import require_positive
from stallscope.errors import DataError, UsageError

log = logging.getLogger(__name__)

MAX_PORT = 65535
# How long a job or worker waits for a dispatcher to answer before saying it is not there.
DEFAULT_CONNECT_TIMEOUT_S = 30.0
_POLL_S = 0.25


def require_port(name: str, value: object) -> None:
    """A TCP port to listen on: 0 (a free one) to 65535. gRPC would wrap a larger number silently."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PORT:
        raise UsageError(f"{name}: expected a port in 0..{MAX_PORT} (0 picks a free one), got {value!r}")


@dataclasses.dataclass(frozen=True)
class ServiceOptions:
    """port: dispatcher port (0 picks a free one); workers: worker processes to start beside it;
    startup_timeout_s: how long the workers may take to register (TensorFlow import included)."""

    port: int = 0
    workers: int = 1
    startup_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        require_port("port", self.port)
        require_positive("workers", self.workers)


def normalize_address(address: str, flag: str = "--data-service") -> str:
    """'host:port' or 'grpc://host:port' -> 'grpc://host:port'; anything else is a one-line error
    naming `flag`, the option the address came from."""
    text = address.strip()
    if not text.startswith("grpc://"):
        text = "grpc://" + text
    host, _, port = text[len("grpc://"):].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
        raise UsageError(f"{flag}: expected HOST:PORT or grpc://HOST:PORT (port 1..{MAX_PORT}), got {address!r}")
    return text


def require_reachable(address: str, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, *, flag: str = "--data-service",
                      timeout_flag: str = "--data-service-timeout",
                      on_wait: Callable[[], None] | None = None) -> None:
    """Returns once a gRPC server answers at `address` (HOST:PORT or grpc://HOST:PORT); otherwise,
    after `timeout_s`, a one-line error naming `flag`.

    TensorFlow's service client retries an absent dispatcher forever inside C++, printing nothing
    and deaf to Ctrl-C, so the handshake is tried here first, in short slices that let a
    KeyboardInterrupt through. `on_wait` is called once if the first slice finds no answer."""
    import grpc

    require_positive_seconds(timeout_flag, timeout_s)
    target = normalize_address(address, flag)[len("grpc://"):]
    deadline = time.monotonic() + timeout_s
    channel = grpc.insecure_channel(target)
    ready = grpc.channel_ready_future(channel)
    try:
        while True:
            try:
                ready.result(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic())))
                return
            except grpc.FutureTimeoutError:
                if time.monotonic() >= deadline:
                    raise UsageError(
                        f"{flag}: expected a tf.data service dispatcher answering at {target}, got no answer "
                        f"within {timeout_s:g} s (is `stallscope serve dispatcher` running there? "
                        f"{timeout_flag} sets the wait)") from None
                if on_wait is not None:
                    on_wait()
                    on_wait = None
    finally:
        ready.cancel()
        channel.close()


def require_positive_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(f"{name}: expected a number of seconds above 0, got {value!r}")


def require_free_port(port: int, flag: str = "--port") -> None:
    """A one-line error for a port another process listens on, before gRPC fails with a log line and
    a bare 'Could not start gRPC server'. Probed the way gRPC binds: every address, SO_REUSEADDR."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as exc:
            why = "in use by another process" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise UsageError(f"{flag}: expected a port free to listen on, got {port} ({why}; "
                             f"--port 0 picks a free one)") from None


def _start_server(start: Callable[[], object], port: int, flag: str):
    """Runs a TF server constructor with gRPC's C++ error lines hidden; a failure is one line."""
    from stallscope.tfimport import stderr_fd_silenced

    try:
        with stderr_fd_silenced():
            return start()
    except RuntimeError as exc:  # gRPC: "Could not start gRPC server"
        raise UsageError(f"{flag}: expected a port free to listen on, got {port} ({exc})") from None


def start_dispatcher(port: int = 0):
    """An in-process dispatcher; its `.target` is the grpc:// address workers and jobs use."""
    import tensorflow as tf

    require_port("port", port)
    require_free_port(port)
    config = tf.data.experimental.service.DispatcherConfig(port=port)
    return _start_server(lambda: tf.data.experimental.service.DispatchServer(config), port, "--port")


def start_worker(dispatcher_address: str, port: int = 0, *, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 on_wait: Callable[[], None] | None = None):
    """An in-process worker registered with the dispatcher (address without grpc://); a dispatcher
    that does not answer within `timeout_s` is a one-line error, not a worker that waits forever."""
    import tensorflow as tf

    require_port("port", port)
    address = normalize_address(dispatcher_address, "--dispatcher")[len("grpc://"):]
    require_reachable(address, timeout_s, flag="--dispatcher", timeout_flag="--dispatcher-timeout", on_wait=on_wait)
    require_free_port(port)
    config = tf.data.experimental.service.WorkerConfig(dispatcher_address=address, port=port)
    return _start_server(lambda: tf.data.experimental.service.WorkerServer(config), port, "--port")


def worker_command(dispatcher_target: str) -> list[str]:
    return [sys.executable, "-m", "stallscope", "serve", "worker", "--dispatcher", dispatcher_target]


@contextlib.contextmanager
def local_service(options: ServiceOptions = ServiceOptions()) -> Iterator[str]:
    """A dispatcher in this process plus `options.workers` worker *processes*; yields its target.

    Workers are separate processes so that their decoding escapes this process's GIL and can be
    pinned or moved elsewhere; they are stopped when the block ends.
    """
    dispatcher = start_dispatcher(options.port)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    logs = [tempfile.TemporaryFile() for _ in range(options.workers)]
    children = [
        subprocess.Popen(worker_command(dispatcher.target), env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=log_file)
        for log_file in logs
    ]
    log.info("tf.data service at %s with %d worker process(es)", dispatcher.target, len(children))
    try:
        _wait_for_workers(dispatcher, children, logs, options.startup_timeout_s)
        yield dispatcher.target
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for log_file in logs:
            log_file.close()
        dispatcher.stop()


def _wait_for_workers(dispatcher, children, logs, timeout_s: float) -> None:
    """Returns once every worker process has registered; a worker that dies first is an error, not
    a job that waits forever for a worker that will never come."""
    count = getattr(dispatcher, "_num_workers", None)
    deadline = time.monotonic() + timeout_s
    while count is not None and count() < len(children):
        for child, log_file in zip(children, logs):
            if child.poll() is not None:
                log_file.seek(0)
                lines = log_file.read().decode("utf-8", "replace").strip().splitlines()
                raise DataError(f"tf.data service worker process exited with code {child.returncode} before "
                                f"registering: {lines[-1] if lines else 'no output'}")
        if time.monotonic() > deadline:
            raise DataError(f"tf.data service: {count()} of {len(children)} worker process(es) registered "
                            f"within {timeout_s:.0f} s")
        time.sleep(0.05)


def distribute(dataset, target: str, *, job_name: str | None = None,
               timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S):
    """Runs `dataset` on the service: each element is produced once by some worker (dynamic sharding).
    A dispatcher that does not answer within `timeout_s` is a one-line error (TF would wait forever)."""
    import tensorflow as tf

    require_reachable(target, timeout_s)
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
        service=normalize_address(target),
        job_name=job_name,
    ))
