"""Run the tf.data service that moves input preprocessing off the training host.

  stallscope serve dispatcher --port 5050              on one machine
  stallscope serve worker --dispatcher HOST:5050       on each machine that should decode
  stallscope serve local --workers 2                   a dispatcher plus worker processes here

Then train with `--data-service HOST:5050`: the pipeline up to the batch runs on the workers.
"""

from __future__ import annotations

import argparse
import signal
import threading

from stallscope.cli.flags import add_flag, non_negative_int, positive_int


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("role", choices=("dispatcher", "worker", "local"), help="what to run")
    add_flag(parser, "port", type=non_negative_int, default=0, help="port to listen on (0: pick a free one)")
    add_flag(parser, "dispatcher", default=None, help="dispatcher HOST:PORT (role worker)")
    add_flag(parser, "workers", type=positive_int, default=1, help="worker processes to start (role local)")


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


def run(args: argparse.Namespace) -> int:
    from stallscope.errors import UsageError
    from stallscope.service import servers

    if args.role == "dispatcher":
        server = servers.start_dispatcher(args.port)
        print(f"tf.data service dispatcher at {server.target}; train with --data-service {server.target}", flush=True)
        _wait_for_signal()
        server.stop()
    elif args.role == "worker":
        if not args.dispatcher:
            raise UsageError("--dispatcher: role worker needs the dispatcher's HOST:PORT")
        server = servers.start_worker(args.dispatcher, args.port)
        print(f"tf.data service worker registered with {servers.normalize_address(args.dispatcher, '--dispatcher')}", flush=True)
        _wait_for_signal()
        server.stop()
    else:
        options = servers.ServiceOptions(port=args.port, workers=args.workers)
        with servers.local_service(options) as target:
            print(f"tf.data service at {target} with {args.workers} worker process(es); "
                  f"train with --data-service {target}; Ctrl-C stops", flush=True)
            _wait_for_signal()
    return 0
