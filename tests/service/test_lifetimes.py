"""The tf.data service's servers listen where they say, stop when told, and bound every wait: real
processes, real servers on this machine. `serve local` stopped every way, and a training job the
service does not feed: tests/faults/test_service.py."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import psutil
import pytest

from stallscope.service import guard, servers

from ..faults.harness import dispatcher_target, end_unfinished

START_S = 150  # TF's import in two processes, on a loaded machine
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def test_a_dispatcher_answers_on_loopback_but_not_at_an_address_it_is_kept_from():
    import grpc

    dispatcher = servers.start_dispatcher()
    kept = guard.PortGuard(dispatcher.port, lambda: ["127.0.0.2"]).start()  # stands for a LAN address
    try:
        assert kept.guarded == ["127.0.0.2"]
        for address, answers in ((f"127.0.0.1:{dispatcher.port}", True), (f"127.0.0.2:{dispatcher.port}", False)):
            channel = grpc.insecure_channel(address)
            try:
                grpc.channel_ready_future(channel).result(timeout=3)
                answered = True
            except grpc.FutureTimeoutError:
                answered = False
            finally:
                channel.close()
            assert answered is answers, address
    finally:
        kept.stop()
        dispatcher.stop()


def test_host_must_be_an_address_of_this_machine(capsys):
    from stallscope.cli.main import main

    assert main(["serve", "dispatcher", "--host", "192.0.2.254"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("stallscope serve: error: --host: expected an address of this machine (127.0.0.1")
    assert err.endswith("or 0.0.0.0 for every interface, got '192.0.2.254'")
    assert servers.require_host("localhost") == "127.0.0.1"


def test_a_wait_for_a_batch_longer_than_the_timeout_ends_the_run_and_time_between_waits_does_not_count():
    import threading

    from stallscope.service.watchdog import ServiceWatch

    said = []
    silent = threading.Event()
    watch = ServiceWatch("grpc://127.0.0.1:1", 0.5, lambda m: (said.append(m), silent.set()), interval_s=0.05)
    with watch:
        for _ in range(3):
            with watch.waiting():
                time.sleep(0.1)  # batches that come in time
            time.sleep(0.7)  # a long step, not a wait for the service
        assert said == []
        with watch.waiting():
            assert silent.wait(10)
    assert said == ["--data-service: the tf.data service at grpc://127.0.0.1:1 sent no batch for 0.5 s (no worker "
                    "registered, or the dispatcher or its workers stopped?); expected batches within "
                    "--data-service-timeout"]


@pytest.mark.timeout(200)
def test_serve_profiler_holds_its_port_at_every_address_but_loopback():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = subprocess.Popen([sys.executable, "-c", f"import stallscope, sys, time; stallscope.serve_profiler({port}); "
                            f"print('ready', flush=True); time.sleep(120)"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert select.select([job.stdout], [], [], START_S)[0] and job.stdout.readline() == "ready\n"
        listening = [c.laddr for c in psutil.Process(job.pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert sorted(a.ip for a in listening) == sorted(
            ["::"] + [a.split("%")[0] for a in guard.other_addresses("127.0.0.1")]), listening
        socket.create_connection(("127.0.0.1", port), timeout=10).close()  # TF's server, on loopback
    finally:
        job.kill()
        job.communicate(timeout=30)


STOP_WAIT_S = 60  # how long a test waits for a stopped worker to end
STOPPED_WITHIN_S = 30.0  # what it asserts: the stop is bounded at STOP_TIMEOUT_S, plus the way out
# A training job in its own process: a client iterating a dynamically sharded range (each element one
# split from the dispatcher) until it is killed.
CLIENT = ("import sys\nimport tensorflow as tf\nfrom stallscope.service import servers\n"
          "elements = iter(servers.distribute(tf.data.Dataset.range(10**9), sys.argv[1]))\n"
          "assert [int(next(elements)) for _ in range(3)] == [0, 1, 2]\nprint('reading', flush=True)\n"
          "for _ in elements:\n    pass\n")


def _registered(worker, target: str) -> bool:
    line = worker.stdout_so_far()
    return line.startswith("tf.data service worker at grpc://127.0.0.1:") and target in line


def _worker_of_a_dispatcher(faults, about: str, launched: list) -> tuple:
    """A `serve dispatcher` and a `serve worker` registered with it (their scenarios named `about`), each
    put in `launched` as it starts, for the test's clean-up; returns (dispatcher, worker, target)."""
    dispatcher = faults.launch(f"serve dispatcher, killed -9 {about[0]}", ["serve", "dispatcher"])
    launched.append(dispatcher)
    dispatcher.wait_for(lambda: dispatcher_target(dispatcher) is not None, START_S,
                        "'tf.data service dispatcher at' line")
    target = dispatcher_target(dispatcher)
    worker = faults.launch(f"serve worker, {about[1]}, its dispatcher gone, SIGTERM",
                           ["serve", "worker", "--dispatcher", target])
    launched.append(worker)
    worker.wait_for(lambda: _registered(worker, target), START_S, "'tf.data service worker at' line")
    return dispatcher, worker, target


@pytest.mark.timeout(300)
def test_a_worker_whose_dispatcher_is_gone_stops_on_sigterm(faults):
    """No job: TF's stop has no task to wait for, so it finishes; exit 0, nothing on stderr."""
    launched: list = []
    try:
        dispatcher, worker, _ = _worker_of_a_dispatcher(faults, ("under an idle worker", "idle"), launched)
        dispatcher.send(signal.SIGKILL)
        dispatcher.finish(30).check(rc=-signal.SIGKILL, within_s=STOPPED_WITHIN_S, stderr_lines=None)
        worker.send(signal.SIGTERM)
        worker.finish(STOP_WAIT_S).check(rc=0, within_s=STOPPED_WITHIN_S, stderr_lines=0)
    finally:
        end_unfinished(*launched)


@pytest.mark.timeout(400)
def test_a_worker_serving_a_job_when_its_dispatcher_dies_stops_on_sigterm(faults):
    """A job in flight: the worker's task waits on the dead dispatcher for its next split, and TF's stop
    waits for the task while holding the GIL. The stop is bounded all the same: exit 0 where TF's stop
    finished, or its one line and exit 130 where it did not within STOP_TIMEOUT_S."""
    from stallscope.cli.serve import stop_overdue_line

    launched: list = []
    client = None
    try:
        dispatcher, worker, target = _worker_of_a_dispatcher(faults, ("mid-job", "mid-job"), launched)
        client = subprocess.Popen([sys.executable, "-c", CLIENT, target], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True, env=ENV)
        assert select.select([client.stdout], [], [], START_S)[0] and client.stdout.readline() == "reading\n"
        dispatcher.send(signal.SIGKILL)  # the client still reads from the worker
        dispatcher.finish(30).check(rc=-signal.SIGKILL, within_s=STOPPED_WITHIN_S, stderr_lines=None)
        worker.send(signal.SIGTERM)
        outcome = worker.finish(STOP_WAIT_S)
    finally:
        if client is not None:
            client.kill()
            client.communicate(timeout=30)
        end_unfinished(*launched)
    assert outcome.rc is not None, "the worker ignored SIGTERM"
    overdue = [stop_overdue_line("worker", servers.STOP_TIMEOUT_S)]
    assert (outcome.rc, outcome.stderr_lines) in ((0, []), (130, overdue)), (outcome.rc, outcome.stderr)
    outcome.check(rc=outcome.rc, within_s=STOPPED_WITHIN_S, stderr_lines=None)
