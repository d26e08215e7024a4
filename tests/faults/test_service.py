"""The tf.data service stopped or left without workers: `serve local` takes its worker with it however
it ends, and a training job the service does not feed ends in one line naming --data-service."""

from __future__ import annotations

import signal

import psutil
import pytest

from stallscope.service import guard, servers

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
