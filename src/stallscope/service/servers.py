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
from pathlib import Path

from stallscope.config import require_folder_to_write, require_positive
from stallscope.errors import DataError, UsageError
from stallscope.service.guard import EVERY_INTERFACE, PortGuard, machine_addresses

log = logging.getLogger(__name__)

MAX_PORT = 65535
# How long a job or worker waits for a dispatcher to answer before saying it is not there.
DEFAULT_CONNECT_TIMEOUT_S = 30.0
_POLL_S = 0.25
LOCAL_HOST = "127.0.0.1"
# How long `stallscope serve`'s stop may take before the process ends without it.
STOP_TIMEOUT_S = 5.0


def require_port(name: str, value: object) -> None:
    """A TCP port to listen on: 0 (a free one) to 65535. gRPC would wrap a larger number silently."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PORT:
        raise UsageError(f"{name}: expected a port in 0..{MAX_PORT} (0 picks a free one), got {value!r}")


@dataclasses.dataclass(frozen=True)
class ServiceOptions:
    """port: dispatcher port (0 picks a free one); workers: worker processes to start beside it;
    startup_timeout_s: how long the workers may take to register (TensorFlow import included);
    host: the address the service is for (see `require_host`): 127.0.0.1 keeps it to this machine."""

    port: int = 0
    workers: int = 1
    startup_timeout_s: float = 120.0
    host: str = LOCAL_HOST

    def __post_init__(self) -> None:
        require_port("port", self.port)
        require_positive("workers", self.workers)
        object.__setattr__(self, "host", require_host(self.host))


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


def require_host(host: str, flag: str = "--host") -> str:
    """The address a server is for: one of this machine's addresses, 'localhost', or 0.0.0.0 / ::
    (every interface). Anything else would be advertised to clients that can never reach it."""
    text = host.strip().strip("[]")
    if text == "localhost":
        return LOCAL_HOST
    if text in EVERY_INTERFACE:
        return text
    own = machine_addresses()
    if text not in [a.split("%", 1)[0] for a in own]:
        shown = ", ".join(a for a in own if "%" not in a)
        raise UsageError(f"{flag}: expected an address of this machine ({shown}) or 0.0.0.0 for every interface, "
                         f"got {host!r}")
    return text


def advertised(host: str) -> str:
    """How clients name a server for `host`: the address itself, or this machine's name for every
    interface; an IPv6 address in brackets."""
    name = socket.gethostname() if host in EVERY_INTERFACE else host
    return f"[{name}]" if ":" in name else name


class ServiceServer:
    """A started dispatcher or worker: TF's server, and the guard keeping its port off other machines."""

    def __init__(self, server, port: int, host: str, guard: PortGuard | None) -> None:
        self.server, self.port, self.host, self.guard = server, port, host, guard

    @property
    def target(self) -> str:
        """The grpc:// address workers and training jobs use."""
        return f"grpc://{advertised(self.host)}:{self.port}"

    def num_tasks(self) -> int | None:
        """Tasks a worker in this process runs (one per job it serves); None where TF does not say."""
        count = getattr(self.server, "_num_tasks", None)
        return count() if count is not None else None

    def num_workers(self) -> int | None:
        """Workers registered with a dispatcher in this process; None where TF does not say."""
        count = getattr(self.server, "_num_workers", None)
        return count() if count is not None else None

    def stop(self) -> None:
        """Stops the guard, then TF's server. TF's worker stop holds the GIL while it waits for its tasks,
        and a task of a dynamically sharded job waits on the dispatcher for its next split, retrying one
        that is gone for an hour: a process that must end in time stops with `stop_or_exit`."""
        if self.guard is not None:
            self.guard.stop()
        self.server.stop()

    def stop_or_exit(self, timeout_s: float, exit_code: int, message: str) -> None:
        """`stop()`, or, where it has not returned within `timeout_s`, `message` on stderr and the end of
        this process with `exit_code` (see exit_deadline.py: no Python code runs while TF's stop waits)."""
        from stallscope.service.exit_deadline import ExitDeadline

        deadline = ExitDeadline(timeout_s, exit_code, message)
        try:
            self.stop()
        finally:
            deadline.cancel()


def _start_server(start: Callable[[], object], port: int, flag: str):
    """Runs a TF server constructor with gRPC's C++ error lines hidden; a failure is one line."""
    from stallscope.tfimport import stderr_fd_silenced

    try:
        with stderr_fd_silenced():
            return start()
    except RuntimeError as exc:  # gRPC: "Could not start gRPC server"
        raise UsageError(f"{flag}: expected a port free to listen on, got {port} ({exc})") from None


def _served(server, host: str) -> ServiceServer:
    """`server` with its port kept to `host` and loopback (see guard.py); says where that fails."""
    port = server._server.bound_port()
    guard = PortGuard(port, host=host).start() if host not in EVERY_INTERFACE else None
    if guard is not None and guard.unguarded:
        log.warning("port %d is open to other machines at %s: TF's server listens on every interface and "
                    "that address could not be taken from it", port, ", ".join(guard.unguarded))
    return ServiceServer(server, port, host, guard)


def start_dispatcher(port: int = 0, host: str = LOCAL_HOST, work_dir: str | os.PathLike | None = None) -> ServiceServer:
    """An in-process dispatcher for `host` (see `ServiceServer`). With `work_dir` it runs in TF's
    fault-tolerant mode: it journals its state (datasets, jobs, workers) there, and a dispatcher
    started again with the same folder and port resumes them; workers and trainers reconnect to it."""
    import tensorflow as tf

    require_port("port", port)
    host = require_host(host)
    if work_dir is not None:
        if port == 0:
            raise UsageError("--work-dir: a restarted dispatcher must come back on the port its workers and trainers "
                             "know; expected --port PORT with it, got --port 0")
        work_dir = str(require_folder_to_write("--work-dir", Path(work_dir)))
    require_free_port(port)
    config = tf.data.experimental.service.DispatcherConfig(port=port, work_dir=work_dir,
                                                           fault_tolerant_mode=work_dir is not None)
    return _served(_start_server(lambda: tf.data.experimental.service.DispatchServer(config), port, "--port"), host)


def start_worker(dispatcher_address: str, port: int = 0, *, host: str = LOCAL_HOST,
                 timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 on_wait: Callable[[], None] | None = None) -> ServiceServer:
    """An in-process worker registered with the dispatcher (address without grpc://), telling it that
    training jobs fetch from `host`; a dispatcher that does not answer within `timeout_s` is a one-line
    error, not a worker that waits forever."""
    import tensorflow as tf

    require_port("port", port)
    host = require_host(host)
    address = normalize_address(dispatcher_address, "--dispatcher")[len("grpc://"):]
    require_reachable(address, timeout_s, flag="--dispatcher", timeout_flag="--dispatcher-timeout", on_wait=on_wait)
    require_free_port(port)
    config = tf.data.experimental.service.WorkerConfig(dispatcher_address=address, port=port,
                                                       worker_address=f"{advertised(host)}:%port%")
    return _served(_start_server(lambda: tf.data.experimental.service.WorkerServer(config), port, "--port"), host)


def worker_command(dispatcher_target: str, host: str = LOCAL_HOST, parent_pid: int | None = None) -> list[str]:
    command = [sys.executable, "-m", "stallscope", "serve", "worker", "--dispatcher", dispatcher_target,
               "--host", host]
    return command + (["--parent-pid", str(parent_pid)] if parent_pid is not None else [])


@contextlib.contextmanager
def local_service(options: ServiceOptions = ServiceOptions()) -> Iterator[str]:
    """A dispatcher in this process plus `options.workers` worker *processes*; yields its target.

    Workers are separate processes so that their decoding escapes this process's GIL and can be
    pinned or moved elsewhere; they are ended by PID when the block ends (an exception, Ctrl-C), and
    end themselves when this process ends any other way.
    """
    dispatcher = start_dispatcher(options.port, options.host)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    logs: list = []
    children: list[subprocess.Popen] = []
    try:
        for _ in range(options.workers):
            logs.append(tempfile.TemporaryFile())
            children.append(subprocess.Popen(worker_command(dispatcher.target, options.host, os.getpid()), env=env,
                                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=logs[-1]))
        log.info("tf.data service at %s with %d worker process(es)", dispatcher.target, len(children))
        _wait_for_workers(dispatcher, children, logs, options.startup_timeout_s)
        yield dispatcher.target
    finally:
        end_children(children)
        for log_file in logs:
            log_file.close()
        dispatcher.stop()


def end_children(children: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """SIGTERM to each child by PID, then SIGKILL to any still there after `timeout_s`."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _wait_for_workers(dispatcher: ServiceServer, children, logs, timeout_s: float) -> None:
    """Returns once every worker process has registered; a worker that dies first is an error, not
    a job that waits forever for a worker that will never come."""
    deadline = time.monotonic() + timeout_s
    while (count := dispatcher.num_workers()) is not None and count < len(children):
        for child, log_file in zip(children, logs):
            if child.poll() is not None:
                log_file.seek(0)
                lines = log_file.read().decode("utf-8", "replace").strip().splitlines()
                raise DataError(f"tf.data service worker process exited with code {child.returncode} before "
                                f"registering: {lines[-1] if lines else 'no output'}")
        if time.monotonic() > deadline:
            raise DataError(f"tf.data service: {count} of {len(children)} worker process(es) registered "
                            f"within {timeout_s:.0f} s")
        time.sleep(0.05)


PROCESSING_MODES = ("dynamic", "parallel_epochs")
COMPRESSION_CHOICES = ("none", "auto")


@dataclasses.dataclass(frozen=True)
class DistributeOptions:
    """How a dataset goes onto the service. processing_mode: "dynamic" (each element made once, by
    whichever worker is free: one pass split over the workers) or "parallel_epochs" (each worker makes
    the whole dataset: for data that is random anyway); compression: "none" (decoded pixels: snappy
    shrinks float32 images 1.00x and costs the workers CPU) or "auto" (TF's default, snappy: encoded or
    sparse elements); job_name: jobs of one name share one stream of elements (several trainers, or a
    trainer restarted, reading on where it stopped); timeout_s: how long to wait for the dispatcher."""

    processing_mode: str = "dynamic"
    compression: str = "none"
    job_name: str | None = None
    timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.processing_mode not in PROCESSING_MODES:
            raise UsageError(f"processing_mode: expected one of {', '.join(PROCESSING_MODES)}, "
                             f"got {self.processing_mode!r}")
        if self.compression not in COMPRESSION_CHOICES:
            raise UsageError(f"compression: expected one of {', '.join(COMPRESSION_CHOICES)}, got {self.compression!r}")
        if self.job_name is not None and (not isinstance(self.job_name, str) or not self.job_name):
            raise UsageError(f"job_name: expected a non-empty name or None, got {self.job_name!r}")
        require_positive_seconds("timeout_s", self.timeout_s)


def distribute(dataset, target: str, options: DistributeOptions = DistributeOptions()):
    """Runs `dataset` on the service at `target` (HOST:PORT or grpc://HOST:PORT) as `options` say. A
    dispatcher that does not answer within `options.timeout_s` is a one-line error (TF would wait forever)."""
    import tensorflow as tf

    service = normalize_address(target)
    require_reachable(target, options.timeout_s)
    mode = (tf.data.experimental.service.ShardingPolicy.DYNAMIC if options.processing_mode == "dynamic"
            else tf.data.experimental.service.ShardingPolicy.OFF)
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=mode, service=service, job_name=options.job_name,
        compression="AUTO" if options.compression == "auto" else None,
    ))
