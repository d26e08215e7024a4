"""The tf.data service glue runs a real dispatcher and real worker processes on loopback."""

import subprocess
import sys

import pytest

from stallscope.errors import UsageError
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
