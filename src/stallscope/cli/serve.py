"""Run the tf.data service that moves input preprocessing off the training host.

  stallscope serve dispatcher --port 5050 --work-dir DIR   on one machine (DIR: resumes after a restart)
  stallscope serve worker --dispatcher HOST:5050       on each machine that should decode
  stallscope serve local --workers 2                   a dispatcher plus worker processes here

Then train with `--data-service HOST:5050`: the pipeline up to the batch runs on the workers.
Every role serves this machine only unless --host says otherwise (see --host in a role's --help).
`stallscope serve ROLE --help` lists the flags of one role.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from stallscope.cli.flags import add_common_flags, add_flag, duration, non_negative_int, positive_int
from stallscope.lifetime import die_with_parent
from stallscope.service.servers import DEFAULT_CONNECT_TIMEOUT_S, LOCAL_HOST

_ROLES = {
    "dispatcher": "hand out the work of training jobs to the workers registered with it",
    "worker": "run pipelines for a dispatcher (one per machine or core set that should decode)",
    "local": "a dispatcher in this process plus worker processes beside it, for one machine",
}


_HOST_HELP = ("the address this server is for (default: 127.0.0.1, this machine only). TF's server listens on "
              "every interface and has no authentication: anyone who can reach it can make it run a dataset "
              "graph (read files, use CPU) as this user, so stallscope closes the port at every other address "
              "of this machine. --host ADDRESS (one of this machine's) opens it there too, and 0.0.0.0 on every "
              "interface: do that only on a network whose machines you trust")


def add_parser(parser: argparse.ArgumentParser) -> None:
    roles = parser.add_subparsers(dest="role", metavar="ROLE", required=True, parser_class=type(parser))
    for role, help_text in _ROLES.items():
        sub = roles.add_parser(role, help=help_text, description=help_text)
        add_common_flags(sub)
        if role == "worker":
            add_flag(sub, "dispatcher", required=True, metavar="HOST:PORT",
                     help="the dispatcher to register with (printed by `stallscope serve dispatcher`)")
            add_flag(sub, "dispatcher_timeout", type=duration, default=DEFAULT_CONNECT_TIMEOUT_S, metavar="DURATION",
                     help=f"give up if the dispatcher does not answer within this long "
                          f"(default: {DEFAULT_CONNECT_TIMEOUT_S:g}s)")
            add_flag(sub, "parent_pid", type=positive_int, default=None, help=argparse.SUPPRESS)  # serve local's
        add_flag(sub, "port", type=non_negative_int, default=0,
                 help=f"port the {'dispatcher' if role != 'worker' else 'worker'} listens on "
                      f"(default: 0, a free one)")
        add_flag(sub, "host", default=LOCAL_HOST, metavar="ADDRESS", help=_HOST_HELP)
        if role == "dispatcher":
            add_flag(sub, "work_dir", default=None, metavar="DIR",
                     help="run fault-tolerant: journal the dispatcher's state (datasets, jobs, workers) in DIR, so "
                          "that a dispatcher restarted with the same DIR and --port resumes them (needs --port)")
        if role != "local":
            add_flag(sub, "status_every", type=duration, default=60.0, metavar="DURATION",
                     help="print a status line this often: workers registered and answering (dispatcher), tasks "
                          "(worker), and this process's CPU (default: 60s)")
        if role == "local":
            add_flag(sub, "workers", type=positive_int, default=1, metavar="N",
                     help="worker processes to start (default: 1)")


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt_on_signals() -> dict:
    """SIGTERM, like Ctrl-C, raises KeyboardInterrupt, from the start: whatever was started (a server,
    worker processes) is stopped on the way out. Later signals are ignored while that happens.
    Returns the handlers it replaced."""
    def interrupt(*_) -> None:
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    return {sig: signal.signal(sig, interrupt) for sig in _SIGNALS}


def _serve_until_signal(server, role: str = "", status_every: float = 0.0, ready: str = "") -> int:
    """Prints `ready`, then waits for SIGINT or SIGTERM, printing a status line every `status_every`
    seconds (0: none), then stops `server` and returns 0: a signal that comes once `ready` is out is a
    clean stop. A stop TF has not finished within STOP_TIMEOUT_S ends the process with one line and
    exit code 130: a worker's stop can wait on a dispatcher that is gone, holding the GIL, so that
    bound is kept by the C library's timers (service/exit_deadline.py), not by Python."""
    from stallscope.service.servers import STOP_TIMEOUT_S
    from stallscope.service.status import StatusMeter

    try:
        if server is not None:
            _warn_if_open(role, server.host)
        print(ready, flush=True)
        meter = StatusMeter(server, role) if server is not None and status_every > 0 else None
        while True:
            time.sleep(status_every if meter is not None else 3600)
            if meter is not None:
                print(meter.line(), flush=True)
    except KeyboardInterrupt:
        pass
    if server is not None:
        sys.stdout.flush()
        server.stop_or_exit(STOP_TIMEOUT_S, 130, stop_overdue_line(role, STOP_TIMEOUT_S))
    return 0


def stop_overdue_line(role: str, timeout_s: float) -> str:
    return (f"stallscope serve: interrupted; the {role}'s stop did not finish within {timeout_s:g} s (TF waits on a "
            f"dispatcher that is gone?), so it ended without it")


def open_to_the_network_line(role: str, host: str) -> str:
    """The warning `serve` prints on stderr for a --host other than loopback."""
    return (f"stallscope serve: warning: --host {host} opens this {role} to the network: anyone who can reach it can "
            f"make it run any dataset graph (read files, use CPU) as this user, and it asks for no authentication; "
            f"do this only on a network whose machines you trust")


def _warn_if_open(role: str, host: str) -> None:
    from stallscope.service.guard import is_loopback

    if not is_loopback(host):
        print(open_to_the_network_line(role, host), file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    before = _interrupt_on_signals()
    try:
        return _run(args)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _run(args: argparse.Namespace) -> int:
    from stallscope.service import servers

    if args.role == "dispatcher":
        server = servers.start_dispatcher(args.port, args.host, work_dir=args.work_dir)
        kept = f"; fault-tolerant, state in {args.work_dir}" if args.work_dir else ""
        return _serve_until_signal(server, "dispatcher", args.status_every, f"tf.data service dispatcher at "
                                   f"{server.target}{kept}; train with --data-service {server.target}")
    if args.role == "worker":
        if args.parent_pid is not None:  # serve local's worker: SIGTERM when it ends, however it ends
            die_with_parent(args.parent_pid, signal.SIGTERM, exit_code=0)
        address = servers.normalize_address(args.dispatcher, "--dispatcher")

        def waiting() -> None:
            print(f"waiting up to {args.dispatcher_timeout:g} s for the dispatcher at {address}", flush=True)

        server = servers.start_worker(args.dispatcher, args.port, host=args.host, timeout_s=args.dispatcher_timeout,
                                      on_wait=waiting)
        return _serve_until_signal(server, "worker", args.status_every,
                                   f"tf.data service worker at {server.target} registered with {address}")
    options = servers.ServiceOptions(port=args.port, workers=args.workers, host=args.host)
    with servers.local_service(options) as target:
        _warn_if_open("service", options.host)
        return _serve_until_signal(None, ready=f"tf.data service at {target} with {args.workers} worker process(es); "
                                               f"train with --data-service {target}; Ctrl-C stops")
