"""The tf.data service stopped or left without workers: `serve local` takes its worker with it however
it ends, and a training job the service does not feed ends in one line naming --data-service."""

from __future__ import annotations

import signal

import psutil
import pytest

from stallscope.service import guard, servers

from .harness import dispatcher_target, end_unfinished

START_S = 150  # TF's import in two processes, on a loaded machine
STOPPED_WITHIN_S = 30.0


def _is_worker(process: psutil.Process) -> bool:
    """serve local's worker (not a short-lived helper an import runs, such as `uname`)."""
    try:
        return "worker" in process.cmdline()
    except psutil.Error:
        return False


def _serving(run) -> bool:
    return run.stdout_so_far().startswith("tf.data service at grpc://127.0.0.1:")


@pytest.mark.timeout(300)
def test_serve_local_stopped_by_sigterm_while_serving_takes_its_worker_and_listened_on_this_machine_only(faults):
    run = faults.launch("serve local --workers 1 SIGTERM", ["serve", "local", "--workers", "1"])
    run.wait_for(lambda: _serving(run), START_S, "'tf.data service at' line")
    tree = [psutil.Process(run.process.pid)] + run.children()
    assert len(tree) == 2, [p.cmdline() for p in tree]  # serve local and its worker
    assert tree[1].cmdline()[-4:] == ["--host", "127.0.0.1", "--parent-pid", str(run.process.pid)]
    for proc in tree:  # gRPC's socket is *:PORT; every address of this machine but loopback is held by us
        listening = [c.laddr for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert len({address.port for address in listening}) == 1, listening
        assert len([a.ip for a in listening if a.ip in ("0.0.0.0", "::")]) == 1, listening
        held = sorted(a.ip for a in listening if a.ip not in ("0.0.0.0", "::"))
        assert held == sorted(a.split("%")[0] for a in guard.other_addresses("127.0.0.1")), listening
    run.send(signal.SIGTERM)
    run.finish(60).check(rc=0, within_s=STOPPED_WITHIN_S, stderr_lines=0)


@pytest.mark.timeout(300)
def test_serve_local_stopped_by_sigterm_while_its_worker_starts_leaves_no_worker(faults):
    run = faults.launch("serve local SIGTERM while the worker starts", ["serve", "local", "--workers", "1"])
    run.wait_for(lambda: any(_is_worker(p) for p in run.children()), START_S, "worker process")
    run.send(signal.SIGTERM)  # the worker is importing TF and has not registered
    outcome = run.finish(60)
    outcome.check(rc=130, within_s=STOPPED_WITHIN_S)
    assert outcome.stderr_lines == ["stallscope serve: interrupted"]


@pytest.mark.timeout(300)
def test_serve_local_killed_takes_its_worker_with_it(faults):
    run = faults.launch("serve local killed -9", ["serve", "local", "--workers", "1"])
    run.wait_for(lambda: _serving(run), START_S, "'tf.data service at' line")
    assert len(run.children()) == 1
    run.send(signal.SIGKILL)  # no handler runs: the kernel tells the worker (PR_SET_PDEATHSIG)
    run.finish(60).check(rc=-signal.SIGKILL, within_s=STOPPED_WITHIN_S, stderr_lines=0)


@pytest.mark.timeout(200)
def test_train_against_a_dispatcher_with_no_worker_ends_in_one_line_within_its_timeout(faults, tiny_tree, tmp_path):
    dispatcher = servers.start_dispatcher()
    try:
        outcome = faults.run("train --data-service, no worker", [
            "train", "--dataset_path", tiny_tree, "--accelerator", "emulated:1ms", "--steps", "2", "--image_size",
            "32", "--batch_size", "4", "--log_path", tmp_path / "run", "--data-service", dispatcher.target,
            "--data-service-timeout", "3s"], 150)
    finally:
        dispatcher.stop()
    outcome.check(rc=2, within_s=150)  # TF's start-up, the 3 s, the way out
    assert outcome.stderr_lines == [
        f"stallscope train: error: --data-service: the tf.data service at {dispatcher.target} sent no batch for 3 s "
        f"(no worker registered, or the dispatcher or its workers stopped?); expected batches within "
        f"--data-service-timeout"]


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _dispatching(run) -> bool:
    return "tf.data service dispatcher at grpc://127.0.0.1:" in run.stdout_so_far()


@pytest.mark.timeout(240)
def test_a_dispatcher_killed_and_restarted_with_its_work_dir_resumes_the_job(faults, tmp_path):
    """Fault-tolerant mode: the restarted dispatcher reads its journal, the worker re-registers, and the
    training job reads on to the end of its pass: every element at most once, nothing left running."""
    import tensorflow as tf

    port, work_dir = _free_port(), tmp_path / "dispatcher-state"
    argv = ["serve", "dispatcher", "--port", port, "--work-dir", work_dir, "--status-every", "1s"]
    first = faults.launch("serve dispatcher --work-dir, killed -9", argv)
    first.wait_for(lambda: _dispatching(first), START_S, "'tf.data service dispatcher at' line")
    assert "fault-tolerant" in first.stdout_so_far()
    worker = servers.start_worker(f"127.0.0.1:{port}", timeout_s=30)
    second = None
    try:
        dataset = servers.distribute(tf.data.Dataset.range(40).map(lambda x: x * 1), f"127.0.0.1:{port}",
                                     servers.DistributeOptions(job_name="resumed", timeout_s=30))
        iterator = iter(dataset)
        before = [int(next(iterator)) for _ in range(5)]
        first.send(signal.SIGKILL)
        first.finish(30).check(rc=-signal.SIGKILL, within_s=STOPPED_WITHIN_S, stderr_lines=None)
        assert any(work_dir.iterdir()), "the dispatcher journalled nothing in its --work-dir"
        second = faults.launch("serve dispatcher --work-dir, restarted", argv)
        second.wait_for(lambda: _dispatching(second), START_S, "the restarted dispatcher's line")
        second.wait_for(lambda: "1 worker(s) registered" in second.stdout_so_far(), 60,
                        "the worker registered again with the restarted dispatcher")
        after = [int(element) for element in iterator]
    finally:
        worker.stop()
        if second is not None:
            second.send(signal.SIGTERM)
            second.finish(60).check(rc=0, within_s=STOPPED_WITHIN_S, stderr_lines=None)
    seen = before + after
    assert len(seen) == len(set(seen)) and set(seen) <= set(range(40))
    assert after, "no element after the restart"


@pytest.mark.timeout(400)
def test_the_dispatcher_status_line_stops_counting_a_killed_worker_as_answering(faults):
    """TF keeps a killed worker registered for good; the status line says how many answer."""
    dispatcher = faults.launch("serve dispatcher, status every 1 s", ["serve", "dispatcher", "--status-every", "1s"])
    workers = []
    try:
        dispatcher.wait_for(lambda: dispatcher_target(dispatcher) is not None, START_S, "'dispatcher at' line")
        target = dispatcher_target(dispatcher)
        workers = [faults.launch(f"serve worker {n} of 2", ["serve", "worker", "--dispatcher", target]) for n in (1, 2)]
        for worker in workers:
            worker.wait_for(lambda: "registered with" in worker.stdout_so_far(), START_S, "'worker at' line")
        dispatcher.wait_for(lambda: "2 worker(s) registered, 2 answering" in dispatcher.stdout_so_far(), 60,
                            "a status line counting both workers")
        workers[0].send(signal.SIGKILL)
        workers[0].finish(30).check(rc=-signal.SIGKILL, within_s=STOPPED_WITHIN_S, stderr_lines=0)
        shown = len(dispatcher.stdout_so_far())
        dispatcher.wait_for(lambda: "2 worker(s) registered, 1 answering" in dispatcher.stdout_so_far()[shown:], 60,
                            "a status line counting the killed worker as registered but not answering")
        workers[1].send(signal.SIGTERM)
        workers[1].finish(60).check(rc=0, within_s=STOPPED_WITHIN_S, stderr_lines=0)
        dispatcher.send(signal.SIGTERM)
        dispatcher.finish(60).check(rc=0, within_s=STOPPED_WITHIN_S, stderr_lines=0)
    finally:
        end_unfinished(dispatcher, *workers)


@pytest.mark.timeout(400)
def test_serve_on_every_interface_warns_in_one_line_that_it_is_open_to_the_network(faults):
    """--host 0.0.0.0 binds every interface; no traffic goes to any address but loopback here."""
    from stallscope.cli.serve import open_to_the_network_line

    dispatcher = faults.launch("serve dispatcher --host 0.0.0.0",
                               ["serve", "dispatcher", "--host", "0.0.0.0", "--status-every", "1h"])
    worker = None
    try:
        dispatcher.wait_for(lambda: dispatcher_target(dispatcher) is not None, START_S, "'dispatcher at' line")
        port = dispatcher_target(dispatcher).rpartition(":")[2]
        worker = faults.launch("serve worker --host 0.0.0.0", ["serve", "worker", "--dispatcher", f"127.0.0.1:{port}",
                                                               "--host", "0.0.0.0", "--status-every", "1h"])
        worker.wait_for(lambda: "registered with" in worker.stdout_so_far(), START_S, "'worker at' line")
        for run, role in ((worker, "worker"), (dispatcher, "dispatcher")):
            run.send(signal.SIGTERM)
            outcome = run.finish(60)
            outcome.check(rc=0, within_s=STOPPED_WITHIN_S, stderr_lines=1)
            assert outcome.stderr_lines == [open_to_the_network_line(role, "0.0.0.0")]
    finally:
        end_unfinished(dispatcher, worker)
