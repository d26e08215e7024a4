"""The commands on data in a bucket: train, evaluate, verify and convert from and to a loopback S3
server, and gs:// failing fast where no store answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from stallscope.cli.main import main

from .conftest import BUCKET, free_port, s3_environment

TINY = ["--image_size", "32", "--batch_size", "4", "--shuffle-buffer", "8", "--accelerator", "emulated:1ms"]


@pytest.mark.parametrize("source, prefix, pipeline, reader", [
    ("files", "tree", "seed", "s3fs (1 in flight)"),
    ("files", "tree", "tuned", "s3fs (16 in flight)"),
    ("records", "records", "tuned", "s3fs (records streamed in 16 MB blocks)"),
])
def test_train_reads_from_a_bucket(s3_env, tmp_path, capsys, source, prefix, pipeline, reader):
    run_dir = tmp_path / "run"
    code = main(["train", "--source", source, "--dataset_path", f"s3://{BUCKET}/{prefix}", "--steps", "6",
                 "--pipeline", pipeline, "--log_path", str(run_dir), *TINY])
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["last_step"] == 6 and summary["source"]["examples"] == 24
    assert summary["source"]["reader"] == reader and f"reader          {reader}" in out
    assert summary["dataset_path"] == f"s3://{BUCKET}/{prefix}"
