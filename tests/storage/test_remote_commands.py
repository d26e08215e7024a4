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


def test_diagnose_reads_from_a_bucket(s3_env, capsys):
    code = main(["diagnose", "--dataset_path", f"s3://{BUCKET}/tree", "--pipeline", "seed", "--batch-size", "4",
                 "--image-size", "32", "--accelerator", "emulated:5ms", "--probe-steps", "6", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert 0.0 <= report["input_share"] <= 1.0 and report["phases"]


def test_evaluate_reads_from_a_bucket(s3_env, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert main(["train", "--dataset_path", str(s3_env["tree"]), "--alpha", "0.25", "--steps", "2", "--image_size", "32",
                 "--batch_size", "4", "--checkpoint_path", str(ckpt), "--log_path", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint_path", str(ckpt), "--dataset_path", f"s3://{BUCKET}/records",
                 "--source", "records", "--split", "train", "--json", "--cpu", "--batch_size", "8"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 2 and result["examples"] == 24


def test_verify_checks_shards_in_a_bucket(s3_env, capsys):
    assert main(["verify", f"s3://{BUCKET}/records"]) == 0
    out = capsys.readouterr().out
    assert f"verify s3://{BUCKET}/records:" in out and "24" in out
    # a damaged shard in the bucket is named, as on disk
    client, records = s3_env["client"], s3_env["records"]
    shard = sorted(records.glob("*.tfrecord"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=f"damaged/{shard.name}", Body=bytes(data))
    for other in sorted(p for p in records.iterdir() if p.is_file() and p != shard):
        client.put_object(Bucket=BUCKET, Key=f"damaged/{other.name}", Body=other.read_bytes())
    assert main(["verify", f"s3://{BUCKET}/damaged", "--no-decode"]) == 1
    out = capsys.readouterr().out
    assert shard.name in out and "sha256" in out


def _shard_bytes(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tfrecord"))}


def test_convert_from_a_bucket_gives_the_shards_of_the_local_tree(s3_env, tmp_path, capsys):
    options = ["--shards", "2", "--workers", "2", "--no-progress"]
    assert main(["convert", str(s3_env["tree"]), "--output_path", str(tmp_path / "local"), *options]) == 0
    assert main(["convert", f"s3://{BUCKET}/tree", "--output_path", str(tmp_path / "remote"), *options]) == 0
    local, remote = _shard_bytes(tmp_path / "local"), _shard_bytes(tmp_path / "remote")
    assert len(local) == 2 and local == remote
    manifest = json.loads((tmp_path / "remote" / "manifest.json").read_text())
    assert manifest["source"] == f"s3://{BUCKET}/tree"


def test_convert_into_a_bucket_publishes_the_manifest_last(s3_env, tmp_path, monkeypatch, capsys):
    from stallscope.storage import location
    from stallscope.storage.location import as_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    written = []
    original = location.upload_file
    monkeypatch.setattr(location, "upload_file", lambda local, path: written.append(path.name) or original(local, path))
    out = f"s3://{BUCKET}/converted"
    assert main(["convert", str(s3_env["tree"]), "--output_path", out, "--shards", "2", "--workers", "1", "--no-progress"]) == 0
    assert f"in {out}" in capsys.readouterr().out
    assert written[-1] == "manifest.json" and sorted(written[:2]) == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    location.forget_listings()
    client = s3_env["client"]
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="converted/")["Contents"])
    assert keys == [f"converted/{name}" for name in ("labels.txt", "manifest.json", *sorted(_shard_bytes(s3_env["records"])))]
    for name, data in _shard_bytes(s3_env["records"]).items():
        assert as_path(f"{out}/{name}").read_bytes() == data
    assert not list((tmp_path / "cache").rglob("*.tfrecord"))  # the staging copy is gone
    assert main(["verify", out]) == 0
    # an object convert did not write: refused, left alone, before any work
    client.put_object(Bucket=BUCKET, Key="converted/notes.txt", Body=b"mine")
    location.forget_listings()
    assert main(["convert", str(s3_env["tree"]), "--output_path", out, "--shards", "2", "--no-progress"]) == 2
    assert "holds 'notes.txt', which `stallscope convert` did not write" in capsys.readouterr().err
