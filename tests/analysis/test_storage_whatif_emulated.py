"""The storage what-if against real `stallscope train` runs through TF's gs:// on the storage emulator.

Coarse on purpose (2 shared cores, tiny data): the model, fed the CPU per image of a local run, puts
reading one file at a time at 20 ms within 0.5x..2x of what the emulator gives, and records beat
files both measured and predicted. benchmarks/storage.py holds the full table.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.analysis import storage_whatif as sw
from stallscope.storage.emulator import emulate

LATENCY_MS = 20.0
# 14 steps of 8 (more than the 80 images): a shorter run is served from the prefetch buffer after its
# warm-up steps and measures thousands of images/s whatever the store does
TRAIN = ["--pipeline", "seed", "--steps", "14", "--batch-size", "8", "--image-size", "64", "--model", "mobilenet",
         "--weights", "none", "--accelerator", "emulated:50000"]


def _stallscope(args: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run([sys.executable, "-m", "stallscope", *args], capture_output=True, text=True, timeout=180,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    assert result.returncode == 0, result.stderr[-1500:]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("emulated-whatif")
    _stallscope(["prepare", "synthetic", "--output", str(root / "files"), "--classes", "2", "--images-per-class", "40",
                 "--long-side", "160-220", "--validation-fraction", "0", "--workers", "1"])
    _stallscope(["convert", str(root / "files"), "--output-path", str(root / "records"), "--train-shards", "2",
                 "--workers", "1", "--no-progress"])
    return {"files": root / "files", "records": root / "records", "runs": root / "runs"}


def _train(data, source: str, path: str, name: str, env: dict[str, str] | None = None) -> float:
    run = data["runs"] / name
    _stallscope(["train", "--source", source, "--dataset_path", path, "--log-path", str(run), *TRAIN], env=env)
    return float(json.loads((run / "summary.json").read_text())["images_per_second"])


def _pattern(source: str, root: Path) -> sw.IoPattern:
    suffix = ".tfrecord" if source == "records" else ".jpg"
    objects = [p for p in (root / "train").rglob("*") if p.is_file()] if source == "files" else \
        sorted(root.glob(f"train-*{suffix}"))
    return sw.pattern_for(source, examples=80, total_bytes=sum(p.stat().st_size for p in objects), files=len(objects))


def test_the_model_predicts_sequential_reads_on_the_emulator_within_2x(data):
    measured, predicted = {}, {}
    local = _train(data, "files", str(data["files"]), "files-local")  # the CPU per image of both formats
    for source in ("files", "records"):
        with emulate(data[source], kind="gcs", latency_s=LATENCY_MS / 1000.0, max_duration_s=240) as store:
            measured[source] = _train(data, source, store.url, f"{source}-gcs", env=store.env)
            assert store.counters().requests > 0, "the run did not read through the store"
        costs = sw.costs(_pattern(source, data[source]), sw.StorageScenario("emulated", LATENCY_MS, math.inf),
                         sw.tf_gcs_client(), cpu_ms_per_image=1000.0 / local)
        predicted[source] = sw.sequential_rate(costs)
    ratio = predicted["files"] / measured["files"]
    assert 0.5 <= ratio <= 2.0, (predicted, measured)
    assert measured["records"] > measured["files"] and predicted["records"] > predicted["files"], (predicted, measured)
