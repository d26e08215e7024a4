"""The tf.data service glue runs a real dispatcher and real worker processes on loopback."""

import subprocess
import sys

import pytest

from stallscope.errors import DataError, UsageError
from stallscope.service import servers


def test_normalize_address():
    assert servers.normalize_address("localhost:5050") == "grpc://localhost:5050"
    assert servers.normalize_address("grpc://10.0.0.1:1") == "grpc://10.0.0.1:1"
    for bad in ("localhost", "grpc://:5050", "host:port"):
        with pytest.raises(UsageError, match="--data-service"):
            servers.normalize_address(bad)


def test_local_service_with_worker_process_produces_every_element_once():
    import tensorflow as tf

    with servers.local_service(servers.ServiceOptions(workers=1)) as target:
        dataset = servers.distribute(tf.data.Dataset.range(50).map(lambda x: x * 3), target)
        values = sorted(int(v) for v in dataset)
    assert values == [x * 3 for x in range(50)]


def test_serve_cli_rejects_worker_without_dispatcher():
    result = subprocess.run([sys.executable, "-m", "stallscope", "serve", "worker"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "stallscope serve worker: error: --dispatcher: expected this flag, got nothing"


def test_pipeline_with_data_service_yields_every_example_once(tiny_tree):
    import numpy as np

    from stallscope.pipeline.builder import build_dataset
    from stallscope.pipeline.config import PipelineConfig
    from stallscope.pipeline.sources import open_source

    source = open_source("files", tiny_tree)
    with servers.local_service(servers.ServiceOptions(workers=1)) as target:
        config = PipelineConfig(batch_size=4, image_size=32, shuffle_buffer=0, data_service=target)
        batches = list(build_dataset(config, source))
    labels = np.concatenate([b[1].numpy().argmax(axis=1) for b in batches])
    assert sorted(labels.tolist()) == sorted(source.file_labels)
    images = np.concatenate([b[0].numpy() for b in batches])
    assert images.shape == (source.num_examples, 32, 32, 3)
    assert images.min() >= -1.0 and images.max() <= 1.0


def test_data_service_address_is_validated():
    from stallscope.pipeline.config import PipelineConfig

    assert PipelineConfig(data_service="localhost:5050").data_service == "grpc://localhost:5050"
    with pytest.raises(UsageError, match="--data-service"):
        PipelineConfig(data_service="nowhere")


def test_ports_out_of_range_are_refused_not_wrapped():
    with pytest.raises(UsageError, match="port: expected a port in 0..65535"):
        servers.ServiceOptions(port=70000)
    with pytest.raises(UsageError, match="port: expected a port in 0..65535"):
        servers.start_dispatcher(70000)  # gRPC would listen on 70000 - 65536 = 4464
    with pytest.raises(UsageError, match="--data-service"):
        servers.normalize_address("localhost:70000")


def test_serve_worker_names_the_dispatcher_flag_in_its_error():
    result = subprocess.run([sys.executable, "-m", "stallscope", "serve", "worker", "--dispatcher", "localhost"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--dispatcher: expected HOST:PORT" in result.stderr.strip().splitlines()[-1]


def test_a_worker_process_that_dies_before_registering_is_an_error_not_a_hang(tmp_path):
    import tempfile

    dispatcher = servers.start_dispatcher()
    log_file = tempfile.TemporaryFile()
    dying = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('cannot start\\n'); sys.exit(3)"],
                             stderr=log_file)
    try:
        with pytest.raises(DataError, match="exited with code 3 before registering: cannot start"):
            servers._wait_for_workers(dispatcher, [dying], [log_file], timeout_s=60)
    finally:
        dying.wait()
        log_file.close()
        dispatcher.stop()


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_an_absent_dispatcher_is_an_error_after_the_timeout_not_a_hang():
    port = _closed_port()
    waits = []
    with pytest.raises(UsageError, match=rf"--data-service: expected a tf.data service dispatcher answering at "
                                         rf"localhost:{port}, got no answer within 0.5 s"):
        servers.require_reachable(f"localhost:{port}", 0.5, on_wait=lambda: waits.append(1))
    assert waits == [1]
    dispatcher = servers.start_dispatcher()
    try:
        servers.require_reachable(dispatcher.target, 30)  # a live one answers at once
    finally:
        dispatcher.stop()


def test_train_and_serve_worker_with_no_dispatcher_end_in_one_line(tiny_tree, tmp_path, capsys):
    from stallscope.cli.main import main

    port = _closed_port()
    code = main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--steps", "2",
                 "--image_size", "32", "--batch_size", "4", "--log_path", str(tmp_path / "run"),
                 "--data-service", f"localhost:{port}", "--data-service-timeout", "1s"])
    assert code == 2
    assert _one_line_error(capsys) == (f"stallscope train: error: --data-service: expected a tf.data service dispatcher "
                                       f"answering at localhost:{port}, got no answer within 1 s (is `stallscope serve "
                                       f"dispatcher` running there? --data-service-timeout sets the wait)")
    assert not (tmp_path / "run").exists()
    code = main(["serve", "worker", "--dispatcher", f"127.0.0.1:{port}", "--dispatcher_timeout", "500ms"])
    assert code == 2
    err = _one_line_error(capsys)
    assert err.startswith(f"stallscope serve: error: --dispatcher: expected a tf.data service dispatcher answering "
                          f"at 127.0.0.1:{port}, got no answer within 0.5 s") and "--dispatcher-timeout" in err


def test_ctrl_c_stops_a_worker_waiting_for_its_dispatcher():
    import signal

    port = _closed_port()
    worker = subprocess.Popen([sys.executable, "-m", "stallscope", "serve", "worker", "--dispatcher",
                               f"127.0.0.1:{port}", "--dispatcher-timeout", "120s"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        import select

        assert select.select([worker.stdout], [], [], 60)[0], "the worker said nothing while waiting"
        assert worker.stdout.readline().startswith(f"waiting up to 120 s for the dispatcher at grpc://127.0.0.1:{port}")
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 130 and err.strip().splitlines()[-1] == "stallscope serve: interrupted"


def test_serve_dispatcher_on_a_port_in_use_is_one_line(capsys):
    import socket

    from stallscope.cli.main import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "dispatcher", "--port", str(port)])
    assert code == 2
    assert _one_line_error(capsys) == (f"stallscope serve: error: --port: expected a port free to listen on, got {port} "
                                       f"(in use by another process; --port 0 picks a free one)")
