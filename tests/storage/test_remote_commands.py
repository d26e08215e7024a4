"""The commands on data in a bucket: train, evaluate, verify and convert from and to a loopback S3
server, and gs:// failing fast where no store answers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from stallscope.cli.main import main
from stallscope.storage import s3_request_plan

from .conftest import BUCKET, child_environment, free_port, s3_environment

TINY = ["--image_size", "32", "--batch_size", "4", "--shuffle-buffer", "8", "--accelerator", "emulated:1ms"]


@pytest.mark.parametrize("source, prefix, pipeline, reader", [
    ("files", "tree", "seed", "s3fs (1 in flight)"),  # STALLSCOPE_S3_READER=s3fs
    ("files", "tree", "tuned", "obstore (128 in flight)"),  # tuned on JPEGs in s3://: 8 groups of 16
    ("records", "records", "tuned", "obstore (records streamed in 16 MB blocks after a 4 MB one, 1 requested ahead, and the next shard's first; 32 MB kept free per heap)"),
])
def test_train_reads_from_a_bucket(s3_env, tmp_path, capsys, monkeypatch, source, prefix, pipeline, reader):
    if reader.startswith("obstore"):
        pytest.importorskip("obstore", reason="obstore (the storage extra) reads s3:// objects where installed")
    monkeypatch.setenv(s3_request_plan.READER_ENV, reader.split()[0])
    run_dir = tmp_path / "run"
    code = main(["train", "--source", source, "--dataset_path", f"s3://{BUCKET}/{prefix}", "--steps", "6",
                 "--pipeline", pipeline, "--log_path", str(run_dir), *TINY])
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["last_step"] == 6 and summary["source"]["examples"] == 24
    assert summary["source"]["reader"] == reader and f"reader          {reader}" in out
    assert summary["dataset_path"] == f"s3://{BUCKET}/{prefix}"
    made = summary["store_requests"]  # what stallscope's reader asked the store for; s3fs counts nothing
    if reader.startswith("s3fs"):
        assert made is None and "store requests" not in out
    else:
        assert made["requests"] >= 2 and made["bytes"] > 0 and 0 < made["median_ms"] <= made["p90_ms"]
        if source == "files":  # one GET per JPEG: requests per byte received, times the bytes of a JPEG
            image_bytes = summary["source"]["bytes"] / summary["source"]["examples"]
            assert made["requests"] * image_bytes / made["bytes"] == pytest.approx(1.0, rel=0.1)
            # per image trained: everything fetched (128 in flight read the 24 JPEGs ahead, again and again)
            assert made["requests_per_image"] == made["requests"] / 24 >= 1.0
            assert summary["fetched"]["read_amplification"] >= 1.0
        assert f"store requests  {made['requests']:,}" in out


def test_diagnose_reads_from_a_bucket(s3_env, capsys):
    code = main(["diagnose", "--dataset_path", f"s3://{BUCKET}/tree", "--pipeline", "seed", "--batch-size", "4",
                 "--image-size", "32", "--accelerator", "emulated:5ms", "--probe-steps", "6", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert 0.0 <= report["input_share"] <= 1.0 and report["phases"]
    assert report["source"]["reader"] == f"{s3_request_plan.reader_name()} (1 in flight)"
    assert report["source"]["path"] == f"s3://{BUCKET}/tree"


def test_diagnose_of_records_in_a_bucket_times_their_reads_alone_for_the_model(s3_env, capsys):
    """Records in a store: the reads of one stream, no decode, are timed where the data is, and the
    what-if's row of the store as read takes them as measured (the requests' model alone predicted a
    parallel decode of seed records on gs:// at 10 ms at +89%, measured -7%)."""
    args = ["diagnose", "--source", "records", "--dataset_path", f"s3://{BUCKET}/records", "--pipeline", "seed",
            "--batch-size", "4", "--image-size", "32", "--accelerator", "emulated:5ms", "--probe-steps", "6"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    reads = report["probes"]["reads_alone"]
    assert reads["records"] >= 1 and reads["ms_per_image"] > 0 and 0 < reads["cpu_ms_per_image"] <= reads["ms_per_image"] * 4
    workload = report["storage_what_if"]["workload"]
    assert workload["read_chain_ms_per_image"] == pytest.approx(reads["ms_per_image"])
    assert main(args) == 0
    assert "records alone" in capsys.readouterr().out
    # files: no such probe (their reads are in the decode map)
    assert main(["diagnose", "--dataset_path", f"s3://{BUCKET}/tree", "--pipeline", "seed", "--batch-size", "4",
                 "--image-size", "32", "--accelerator", "emulated:5ms", "--probe-steps", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["probes"]["reads_alone"] is None


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
    assert main(["verify", f"s3://{BUCKET}/no-such-prefix"]) == 2
    assert "does not exist (nothing is stored under this prefix)" in capsys.readouterr().err


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


def test_convert_from_a_bucket_skips_hidden_objects_as_the_local_tree_does(s3_env, tmp_path, capsys):
    """A listing holds objects only, so a name alone rules one out: the same files, by the same
    reasons, as the file system's walk of the same tree."""
    tree = tmp_path / "hidden-tree"
    shutil.copytree(s3_env["tree"], tree)
    first_class = sorted(p for p in tree.iterdir() if p.is_dir())[0]
    (first_class / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (first_class / ".cache").mkdir()
    shutil.copy(next(first_class.glob("*.jpg")), first_class / ".cache" / "copy.jpg")
    for path in sorted(p for p in tree.rglob("*") if p.is_file()):
        s3_env["client"].upload_file(str(path), BUCKET, f"hidden-tree/{path.relative_to(tree).as_posix()}")

    options = ["--shards", "2", "--workers", "2", "--no-progress"]
    assert main(["convert", str(tree), "--output_path", str(tmp_path / "local"), *options]) == 0
    assert main(["convert", f"s3://{BUCKET}/hidden-tree", "--output_path", str(tmp_path / "remote"), *options]) == 0
    local, remote = (json.loads((tmp_path / side / "manifest.json").read_text()) for side in ("local", "remote"))
    hidden = sorted(e["path"] for e in local["skipped"] if e["reason"] == "hidden file")
    assert len(hidden) == 2
    assert remote["skipped"] == local["skipped"]
    assert _shard_bytes(tmp_path / "local") == _shard_bytes(tmp_path / "remote")


@pytest.mark.parametrize("workers", [1, 2])
def test_convert_from_a_bucket_reports_progress_up_to_every_image(s3_env, tmp_path, workers):
    """A tree in a bucket is written by the parent from fetched chunks: its progress counts each image
    once, rising, and ends at the total when the last shard is committed."""
    from stallscope.records.convert import ConvertOptions, convert_tree

    seen: list[tuple[int, int]] = []
    options = ConvertOptions(f"s3://{BUCKET}/tree", tmp_path / "out", shards=2, workers=workers)
    report = convert_tree(options, progress=lambda done, total: seen.append((done, total)))
    done, total = seen[-1]
    assert done == total >= report.examples > 0
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert len(seen) > 2  # more than the start and the end

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


@pytest.mark.parametrize("url, overrides, needle", [
    ("s3://no-such-bucket/tree", {}, "bucket 'no-such-bucket' does not exist"),
    (f"s3://{BUCKET}/no-such-prefix", {}, f"'s3://{BUCKET}/no-such-prefix' does not exist"),
    (f"s3://{BUCKET}/tree", {"AWS_SECRET_ACCESS_KEY": "wrong"}, "s3:// refused the credentials (SignatureDoesNotMatch)"),
    (f"s3://{BUCKET}/tree", {"AWS_ACCESS_KEY_ID": ""}, "no credentials for s3://"),
    (f"s3://{BUCKET}/tree", {"AWS_ENDPOINT_URL": "dead"}, "refused the connection (nothing listens there"),
])
def test_store_errors_are_one_line_with_exit_2(s3_env, monkeypatch, capsys, url, overrides, needle):
    for name, value in overrides.items():
        if value == "dead":
            value = f"http://127.0.0.1:{free_port()}"  # a closed port
        monkeypatch.setenv(name, value) if value else monkeypatch.delenv(name)
    started = time.monotonic()
    code = main(["train", "--dataset_path", url, "--steps", "2", "--storage-timeout", "3", *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("stallscope train: error: --dataset_path: ") and needle in err
    assert time.monotonic() - started < 30


def _run_cli(args: list[str], env: dict[str, str], limit_s: float) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "stallscope", *args], env=env, capture_output=True, text=True,
                          timeout=limit_s)
    return done.returncode, done.stderr.strip(), time.monotonic() - started


def _base_env() -> dict[str, str]:
    return child_environment()


@pytest.mark.parametrize("proxy", ["closed", "silent"])
def test_gs_without_a_reachable_store_is_one_line_not_a_hang(proxy, silent_port):
    """TF's own gs:// client through an HTTPS proxy that refuses (a closed port) or never answers."""
    port = free_port() if proxy == "closed" else silent_port
    env = _base_env() | {"HTTPS_PROXY": f"http://127.0.0.1:{port}", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "x",
                         "NO_GCE_CHECK": "true"}
    code, err, seconds = _run_cli(["verify", "gs://some-bucket/records", "--storage-timeout", "2"], env, 120)
    assert code == 2 and len(err.splitlines()) == 1, err
    # a proxy that refuses: waiting longer cannot help, and the line says it is the proxy; one that never answers
    expected = (f"the HTTPS proxy at http://127.0.0.1:{port} refused the connection" if proxy == "closed"
                else "the store did not answer")
    assert err.startswith(f"stallscope verify: error: RECORDS_DIR: gs://some-bucket/records: {expected}"), err
    assert seconds < 90  # TF's own client would retry 10 times, backing off up to 32 s


def test_a_resumed_run_from_a_bucket_fetches_no_image_it_skips(s3_env, monkeypatch):
    from stallscope.pipeline.builder import build_dataset
    from stallscope.pipeline.presets import get_preset
    from stallscope.pipeline.sources import open_source
    from stallscope.storage import tfdata_readers

    source = open_source("files", f"s3://{BUCKET}/tree")
    config = get_preset("tuned").replace(batch_size=4, image_size=32, shuffle_buffer=8)
    fetched = []
    original = tfdata_readers.read_many
    monkeypatch.setattr(tfdata_readers, "read_many", lambda paths, n: fetched.extend(paths) or original(paths, n))
    batches = list(build_dataset(config, source, skip_examples=20))
    assert len(batches) == 1 and batches[0][0].shape[0] == 4
    assert len(fetched) == 4  # the 20 images skipped were never fetched


def test_a_store_that_dies_mid_run_is_one_line_and_leaves_no_iterator_behind(s3_env, monkeypatch, capsys, tmp_path):
    """The failed run's tf.data iterator is freed when the error is dropped, not left in a reference
    cycle for the garbage collector, which may free it in one of the pipeline's own Python calls
    (which then waits for itself: the next test hung there). Nor is its run folder left behind, which
    held only an empty events file (and, without --log_path, landed in the repository's runs/)."""
    import gc

    from tensorflow.python.data.ops.iterator_ops import OwnedIterator

    from stallscope.pipeline.sources import open_source

    open_source("files", f"s3://{BUCKET}/tree")  # listed while the store answers (the listing is kept)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # then it is gone
    gc.collect()
    gc.disable()
    try:
        code = main(["train", "--dataset_path", f"s3://{BUCKET}/tree", "--steps", "4", "--storage-timeout", "2",
                     "--log_path", str(tmp_path / "run"), *TINY])
        left = [o for o in gc.get_objects() if isinstance(o, OwnedIterator)]
    finally:
        gc.enable()
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert left == []
    assert err.startswith(f"stallscope train: error: s3://{BUCKET}/tree/") and "refused the connection" in err
    assert not (tmp_path / "run").exists()


def test_shards_whose_store_dies_mid_run_fail_with_a_storage_error(s3_env, monkeypatch, tmp_path):
    from stallscope.pipeline.presets import get_preset
    from stallscope.pipeline.sources import open_source
    from stallscope.storage import location
    from stallscope.storage.location import StorageError
    from stallscope.workload.train import TrainOptions, run_training

    source = open_source("records", f"s3://{BUCKET}/records")  # the listing and manifest, while it answers
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    location.set_timeout(2)  # a new client, for the endpoint that is gone
    options = TrainOptions(source="records", dataset_path=source.path, accelerator="emulated:1ms", steps=4,
                           pipeline=get_preset("tuned").replace(batch_size=4, image_size=32, shuffle_buffer=8),
                           log_path=tmp_path / "run")
    with pytest.raises(StorageError, match=f"s3://{BUCKET}/records/train-0000.-of-00002.tfrecord: .*refused the connection"):
        run_training(options, source=source)


def test_a_listing_that_waits_on_a_silent_store_holds_up_no_other_lookup(s3_env, monkeypatch, silent_port):
    """Listings are cached per process; asking the store for one must not block lookups in another
    (a later run in the same process, tf.data threads reading paths already listed)."""
    import threading

    from stallscope.storage import location

    listed = location.as_path(f"s3://{BUCKET}/tree")
    classes = list(listed.iterdir())  # listed while the store answers, and kept
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent_port}")
    location.set_timeout(2)  # a new client, for the store that hangs
    outcome = []

    def look_up_records() -> None:
        try:
            location.as_path(f"s3://{BUCKET}/records").exists()
        except location.StorageError as exc:
            outcome.append(str(exc))

    waiting = threading.Thread(target=look_up_records, daemon=True)
    waiting.start()
    time.sleep(0.5)  # the listing of records/ is now waiting on the silent store
    assert waiting.is_alive()
    assert len(classes) == 3 and all(c.is_dir() for c in classes) and len(list(listed.walk_files())) == 24
    assert waiting.is_alive()  # the lookups above did not wait for it
    waiting.join(timeout=60)
    assert outcome and "did not answer" in outcome[0]
