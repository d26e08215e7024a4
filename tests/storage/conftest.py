"""A real S3 server on loopback (moto in server mode, its own process) holding a tiny JPEG tree and
the TFRecord shards `stallscope convert` makes of it.

The server binds 127.0.0.1 only, lives at most SERVER_LIFETIME_S (coreutils `timeout`), and is ended
by its PID when the session ends. It checks credentials: the fixture creates one IAM user with an
access key allowed s3:*, in the three requests moto lets through before it starts checking.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.records.convert import ConvertOptions, convert_tree
from stallscope.storage import location

SERVER_LIFETIME_S = 3600  # a safety net past the whole suite (a session-long server), not a test's limit
BUCKET = "data"
ALLOW_S3 = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_tree) -> Path:
    """The folder the stores serve: `tree/` (3 classes x 8 JPEGs) and `records/` (its 2 shards)."""
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(tiny_tree, root / "tree")
    convert_tree(ConvertOptions(dataset_path=root / "tree", output_path=root / "records", shards=2, workers=1))
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _moto_server() -> str | None:
    found = Path(sys.executable).with_name("moto_server")
    return str(found) if found.exists() else shutil.which("moto_server")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory, tiny_tree):
    """(endpoint URL, access key id, secret key) of a loopback S3 server with bucket BUCKET holding
    `tree/` (the shared tiny tree: 3 classes x 8 JPEGs) and `records/` (its conversion, 2 shards), plus
    the local copies."""
    server = _moto_server()
    if server is None:
        pytest.skip("moto_server not installed: pip install 'moto[server]' (the test extra) to run the s3:// tests")
    boto3 = pytest.importorskip("boto3")
    port = free_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    process = subprocess.Popen(["timeout", str(SERVER_LIFETIME_S), server, "-H", "127.0.0.1", "-p", str(port)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("the moto S3 server did not start within 30 s")
                time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        admin = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=ALLOW_S3)
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
        s3.create_bucket(Bucket=BUCKET)
        root = tmp_path_factory.mktemp("s3data")
        tree = tiny_tree
        records = root / "records"
        convert_tree(ConvertOptions(dataset_path=tree, output_path=records, shards=2, workers=1))
        for local, prefix in ((tree, "tree"), (records, "records")):
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                s3.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local).as_posix()}")
        yield {"endpoint": endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"],
               "tree": tree, "records": records, "client": s3}
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def s3_environment(server: dict, **overrides: str) -> dict[str, str]:
    """The AWS variables that point s3fs at the test server, with no other credentials to fall back on."""
    env = {
        "AWS_ACCESS_KEY_ID": server["key"], "AWS_SECRET_ACCESS_KEY": server["secret"],
        "AWS_ENDPOINT_URL": server["endpoint"], "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
    }
    env.update(overrides)
    return env


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """This process's environment pointed at the test server; a fresh client and no cached listings."""
    for name, value in s3_environment(s3_server).items():
        monkeypatch.setenv(name, value)
    location.set_timeout(10)
    location.forget_listings()
    yield s3_server
    location.forget_listings()
    location.set_timeout(location.DEFAULT_TIMEOUT_S)


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child process's environment: this one's PATH, HOME and PYTHONPATH, quiet TF, and `extra`;
    nothing else (no credentials or proxies of the machine running the tests)."""
    keep = ("PATH", "HOME", "PYTHONPATH", "LANG", "TMPDIR")
    return {name: os.environ[name] for name in keep if name in os.environ} | {"TF_CPP_MIN_LOG_LEVEL": "2"} | (extra or {})
