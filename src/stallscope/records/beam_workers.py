"""A Beam conversion interrupted (Ctrl-C, SIGTERM) stops as an interrupt, its worker processes with it.

With `--direct_running_mode=multi_processing`, Beam's FnApiRunner starts each SDK worker as a
process (`/bin/sh -c python -m apache_beam.runners.worker.sdk_worker_main`) talking to this one over
gRPC. Interrupted, this process closed its end and each worker printed a 20-line gRPC traceback on
the way out, onto convert's own stderr. The workers are ended by PID first, with SIGKILL: a worker
writes a shard under a temporary name and renames it when whole, so nothing it leaves is taken for
finished, and the next run clears its unfinished files.

In this process (in_memory), the interrupt lands inside a DoFn: Beam logs it with its traceback and
re-raises it as a RuntimeError, which the pipeline's caller took for a failed pipeline. Both are
told apart here by the KeyboardInterrupt in the exception's chain.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

SDK_WORKER_MODULE = "apache_beam.runners.worker.sdk_worker_main"
STOP_WAIT_S = 5.0


def beam_worker_processes() -> list[psutil.Process]:
    """This process's descendants that run a Beam SDK worker (the shell Beam starts it through included)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if any(SDK_WORKER_MODULE in part for part in process.cmdline()):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_beam_workers() -> int:
    """SIGKILL to every Beam SDK worker below this process, waited for; returns how many there were."""
    workers = beam_worker_processes()
    for process in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    _, alive = psutil.wait_procs(workers, timeout=STOP_WAIT_S)
    if alive:
        log.warning("Beam worker process(es) %s did not end within %g s", [p.pid for p in alive], STOP_WAIT_S)
    return len(workers)


def _interrupt_in(error: BaseException | None) -> bool:
    """Whether `error` is, or was raised while handling or because of, a KeyboardInterrupt."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


class _InterruptIsNoError(logging.Filter):
    """Drops Beam's ERROR record (with its traceback) of a DoFn that was interrupted."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and _interrupt_in(record.exc_info[1]))


BEAM_RUNNER_LOGGER = "apache_beam.runners.common"


@contextlib.contextmanager
def beam_stops_on_interrupt() -> Iterator[None]:
    """For the block: an interrupt, however Beam wraps it, leaves as KeyboardInterrupt, after Beam's
    worker processes are stopped; Beam does not log it as a failure."""
    quiet = _InterruptIsNoError()
    logging.getLogger(BEAM_RUNNER_LOGGER).addFilter(quiet)
    try:
        yield
    except BaseException as error:
        if not _interrupt_in(error):
            raise
        stopped = stop_beam_workers()
        if stopped:
            log.info("stopped %d Beam worker process(es)", stopped)
        raise KeyboardInterrupt from None
    finally:
        logging.getLogger(BEAM_RUNNER_LOGGER).removeFilter(quiet)


BEAM_LOGGER = "apache_beam"


@contextlib.contextmanager
def worker_output_aside() -> Iterator[Path]:
    """For the block, Beam's chatter goes to a log file instead of convert's stderr: its SDK worker
    processes print their start-up and log lines (about 45 a run of two workers) to the stderr they
    inherit, and the runner forwards each worker's log records to this process's log. This process's
    own output (the progress bar, warnings, the one-line error) still reaches the terminal. The file
    goes when the block ends, whatever the outcome: a run that failed is rerun with --debug or -v to see
    the workers' lines (the CLI then keeps them on the terminal)."""
    sys.stderr.flush()
    handle, name = tempfile.mkstemp(prefix="stallscope-beam-workers-", suffix=".log")
    terminal = os.dup(2)
    beam_log = logging.getLogger(BEAM_LOGGER)
    to_file = logging.FileHandler(name)
    to_file.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved_stderr, saved_propagate = sys.stderr, beam_log.propagate
    ours = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)
            and getattr(h, "stream", None) is saved_stderr]
    os.dup2(handle, 2)  # what a child inherits
    os.close(handle)
    sys.stderr = os.fdopen(terminal, "w", buffering=1, closefd=False)  # what this process writes
    for handler in ours:
        handler.setStream(sys.stderr)
    beam_log.addHandler(to_file)
    beam_log.propagate = False
    try:
        yield Path(name)
    finally:
        beam_log.removeHandler(to_file)
        beam_log.propagate = saved_propagate
        to_file.close()
        sys.stderr.flush()
        os.dup2(terminal, 2)
        os.close(terminal)
        sys.stderr = saved_stderr
        for handler in ours:
            handler.setStream(saved_stderr)
        with contextlib.suppress(OSError):
            os.unlink(name)
