"""`convert --runner beam` from and into a loopback S3 bucket: the workers read the objects and upload
their own shards; the result is the local convert's bytes, the manifest comes last, and an
interrupted run leaves an unfinished-looking prefix that the same command finishes."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("apache_beam", reason="Apache Beam is not installed (the `beam` extra, which `test` pulls in)")

from stallscope.cli.main import main  # noqa: E402
from stallscope.records import beam_convert  # noqa: E402
from stallscope.storage import location  # noqa: E402

from .conftest import BUCKET  # noqa: E402

BEAM = ["--runner", "beam", "--beam-option", "--direct_running_mode=in_memory"]


@pytest.fixture
def s3_env(s3_env):
    """The storage timeout at the product's default (30 s), not the 10 s the shared fixture sets: no test
    here waits for it to fire, and a shard's PUT on a fresh client (one per test) once took all of 10 s
    under a full suite on 2 loaded cores (the writer's test), failing a test that asserts nothing of time."""
    location.set_timeout(location.DEFAULT_TIMEOUT_S)
    return s3_env


def _keys(client, prefix: str) -> list[str]:
    location.forget_listings()
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/").get("Contents", [])
    return sorted(o["Key"][len(prefix) + 1:] for o in listed)


def _object(client, key: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def test_beam_converts_a_bucket_into_a_bucket_as_the_local_convert_does(s3_env, capsys):
    client, records = s3_env["client"], s3_env["records"]
    out = f"s3://{BUCKET}/beam-out"
    argv = ["convert", f"s3://{BUCKET}/tree", "--output_path", out, "--shards", "2", "--no-progress", *BEAM]
    assert main(argv) == 0, capsys.readouterr().err
    shards = sorted(p.name for p in records.glob("*.tfrecord"))
    assert _keys(client, "beam-out") == sorted(["labels.txt", "manifest.json", *shards])  # no state, no temporaries
    for name in shards:
        assert _object(client, f"beam-out/{name}") == (records / name).read_bytes(), name
    manifest = json.loads(_object(client, "beam-out/manifest.json"))
    local = json.loads((records / "manifest.json").read_text())
    assert manifest["splits"] == local["splits"] and manifest["skipped"] == local["skipped"]
    assert manifest["source"] == f"s3://{BUCKET}/tree"
    assert main(["verify", out]) == 0


def test_an_interrupted_beam_run_into_a_bucket_never_looks_finished(s3_env, monkeypatch, capsys):
    client, records = s3_env["client"], s3_env["records"]
    out = f"s3://{BUCKET}/beam-resume"
    argv = ["convert", str(s3_env["tree"]), "--output_path", out,
            "--shards", "2", "--no-progress", *BEAM]
    failing = "train-00001-of-00002.tfrecord"
    original = beam_convert.convert_shard

    def dies_on_one_shard(task):
        if task.filename == failing:
            raise RuntimeError("worker lost")
        return original(task)

    monkeypatch.setattr(beam_convert, "convert_shard", dies_on_one_shard)
    assert main(argv) == 2
    assert "the Beam pipeline failed" in capsys.readouterr().err
    keys = _keys(client, "beam-resume")
    assert "manifest.json" not in keys and failing not in keys
    assert ".stallscope-convert/run.json" in keys
    assert main(["verify", out]) == 1
    finish = "--runner beam --beam-option=--direct_running_mode=in_memory` again to finish it"
    printed = capsys.readouterr().out
    assert "an unfinished conversion" in printed and finish in printed

    monkeypatch.setattr(beam_convert, "convert_shard", original)
    assert main(argv) == 0, capsys.readouterr().err
    assert "kept 1 complete shard(s) from an interrupted run" in capsys.readouterr().out
    shards = sorted(p.name for p in records.glob("*.tfrecord"))
    assert _keys(client, "beam-resume") == sorted(["labels.txt", "manifest.json", *shards])
    for name in shards:
        assert _object(client, f"beam-resume/{name}") == (records / name).read_bytes(), name


def test_the_uploading_writer_commits_by_rename_and_aborts_without_a_trace(s3_env):
    from stallscope.records.writer import frame_record
    from stallscope.storage.location import as_path

    client = s3_env["client"]
    frames = [frame_record(b"one"), frame_record(b"two" * 100)]
    final = as_path(f"s3://{BUCKET}/writer/train-00000-of-00001.tfrecord")
    seen_before_rename = []
    with beam_convert.UploadingShardWriter(final) as writer:
        for frame in frames:
            writer.write_framed(frame)
        info = writer.commit(before_rename=lambda i: seen_before_rename.append(_keys(client, "writer")))
    assert len(seen_before_rename[0]) == 1 and seen_before_rename[0][0].startswith(".train-00000-of-00001.tfrecord.tmp-")
    assert _object(client, f"writer/{final.name}") == b"".join(frames)
    assert (info.records, info.bytes) == (2, len(b"".join(frames)))
    assert _keys(client, "writer") == [final.name]

    with pytest.raises(RuntimeError):
        with beam_convert.UploadingShardWriter(as_path(f"s3://{BUCKET}/writer/train-00000-of-00002.tfrecord")) as writer:
            writer.write_framed(frames[0])
            raise RuntimeError("a worker dies mid-shard")
    assert _keys(client, "writer") == [final.name]
