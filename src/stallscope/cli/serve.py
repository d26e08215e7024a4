"""Run the tf.data service that moves input preprocessing off the training host.

  stallscope serve dispatcher --port 5050              on one machine
  stallscope serve worker --dispatcher HOST:5050       on each machine that should decode
  stallscope serve local --workers 2                   a dispatcher plus worker processes here

Then train with `--data-service HOST:5050`: the pipeline up to the batch runs on the workers.
`stallscope serve ROLE --help` lists the flags of one role.
"""

from __future__ import annotations

import argparse
import signal
import threading

from stallscope.cli.flags import add_common_flags, add_flag, duration, non_negative_int, positive_int
from stallscope.service.servers import DEFAULT_CONNECT_TIMEOUT_S

_ROLES = {
    "dispatcher": "hand out the work of training jobs to the workers registered with it",
    "worker": "run pipelines for a dispatcher (one per machine or core set that should decode)",
    "local": "a dispatcher in this process plus worker processes beside it, for one machine",
}


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
        add_flag(sub, "port", type=non_negative_int, default=0,
                 help=f"port the {'dispatcher' if role != 'worker' else 'worker'} listens on "
                      f"(default: 0, a free one)")
        if role == "local":
            add_flag(sub, "workers", type=positive_int, default=1, metavar="N",
                     help="worker processes to start (default: 1)")


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


def run(args: argparse.Namespace) -> int:
    from stallscope.service import servers

    if args.role == "dispatcher":
        server = servers.start_dispatcher(args.port)
        print(f"tf.data service dispatcher at {server.target}; train with --data-service {server.target}", flush=True)
        _wait_for_signal()
        server.stop()
    elif args.role == "worker":
        address = servers.normalize_address(args.dispatcher, "--dispatcher")

        def waiting() -> None:
            print(f"waiting up to {args.dispatcher_timeout:g} s for the dispatcher at {address}", flush=True)

        server = servers.start_worker(args.dispatcher, args.port, timeout_s=args.dispatcher_timeout, on_wait=waiting)
        print(f"tf.data service worker registered with {address}", flush=True)
        _wait_for_signal()
        server.stop()
    else:
        options = servers.ServiceOptions(port=args.port, workers=args.workers)
        with servers.local_service(options) as target:
            print(f"tf.data service at {target} with {args.workers} worker process(es); "
                  f"train with --data-service {target}; Ctrl-C stops", flush=True)
            _wait_for_signal()
    return 0
