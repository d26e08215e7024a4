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
    assert result.stderr.strip().splitlines()[-1].endswith("--dispatcher: role worker needs the dispatcher's HOST:PORT")


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
