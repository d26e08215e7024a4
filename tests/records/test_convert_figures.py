"""convert's closing figures are of this run: the images it converted (not those of shards an earlier run
left), over its whole time; into a bucket, the upload counted, and the staging folder set and named."""

from __future__ import annotations

import time

import pytest

from stallscope.cli.main import main
from stallscope.errors import DataError, UsageError
from stallscope.records.convert import ConvertOptions, convert_tree, format_summary
from stallscope.records.remote_output import staging_dir
from stallscope.storage import location
from stallscope.storage.location import StorageError, as_path

from ..storage.conftest import BUCKET, s3_env, s3_server  # noqa: F401 (fixtures)
from .test_ownership import _interrupted_conversion


def test_a_resumed_conversion_counts_only_the_images_it_converted(tiny_tree, tmp_path):
    """A resume that kept 33 of 64 shards said 'converted 16000 images ... 12932 images/s' for 7,750."""
    out = _interrupted_conversion(tiny_tree, tmp_path / "out")  # 3 of 8 shards of 3 images kept
    report = convert_tree(ConvertOptions(tiny_tree, out, shards=8, workers=1))
    assert (report.examples, report.kept_examples, report.converted_examples, report.reused_shards) == (24, 9, 15, 3)
    assert report.images_per_second == pytest.approx(15 / report.elapsed_s)
    first = format_summary(report)[0]
    assert first.startswith("converted 15 images (9 kept from an earlier run; 24 in all) into 8 shards"), first
    fresh = convert_tree(ConvertOptions(tiny_tree, tmp_path / "fresh", shards=8, workers=1))
    assert fresh.kept_examples == 0 and format_summary(fresh)[0].startswith("converted 24 images into 8 shards")
    assert fresh.input_bytes > report.input_bytes > 0, "the kept shards' files were not read again"


def test_into_a_bucket_the_time_counts_the_upload(s3_env, tmp_path, monkeypatch):  # noqa: F811
    """'4.2 s, 3832 images/s' for a command of 18.6 s: the upload was not counted."""
    uploaded = []
    upload = location.upload_file

    def timed_upload(local, path):
        upload(local, path)
        uploaded.append(time.perf_counter())

    monkeypatch.setattr(location, "upload_file", timed_upload)
    started = time.perf_counter()
    report = convert_tree(ConvertOptions(s3_env["tree"], f"s3://{BUCKET}/timed", shards=2, workers=1,
                                         staging_dir=tmp_path / "staging"))
    assert uploaded and report.elapsed_s >= uploaded[-1] - started, (report.elapsed_s, uploaded[-1] - started)
    assert report.images_per_second == pytest.approx(report.examples / report.elapsed_s)


def test_the_staging_folder_is_settable_and_named_when_a_run_fails(s3_env, tmp_path, monkeypatch, capsys):  # noqa: F811
    out = f"s3://{BUCKET}/staged"
    root = tmp_path / "staging"
    local = staging_dir(as_path(out), root)
    upload = location.upload_file

    def fail_on_the_manifest(path_here, path):
        if path.name == "manifest.json":
            raise StorageError(f"{path}: the store stopped answering")
        upload(path_here, path)

    monkeypatch.setattr(location, "upload_file", fail_on_the_manifest)
    argv = ["convert", str(s3_env["tree"]), "--output_path", out, "--shards", "2", "--workers", "1", "--no-progress",
            "--staging-dir", str(root)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"the conversion so far stays in the staging folder {str(local)!r}" in err, err
    assert f"temporary objects left in {out} go with a rerun" in err and "after 600 s" in err, err
    assert sorted(p.name for p in local.glob("*.tfrecord")) == ["train-00000-of-00002.tfrecord",
                                                                "train-00001-of-00002.tfrecord"]
    monkeypatch.setattr(location, "upload_file", upload)
    location.forget_listings()
    assert main(argv) == 0
    assert "in " + out in capsys.readouterr().out
    assert not local.exists(), "published: the staging copy is gone"


def test_a_local_failure_names_the_staging_folder_too(s3_env, tmp_path, capsys):  # noqa: F811
    bad = tmp_path / "bad"
    (bad / "a").mkdir(parents=True)
    (bad / "a" / "x.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match=r"no usable images.*; the conversion so far stays in the staging folder"):
        convert_tree(ConvertOptions(bad, f"s3://{BUCKET}/bad", workers=1, staging_dir=tmp_path / "staging"))


def test_a_staging_dir_for_a_local_output_is_refused(tiny_tree, tmp_path):
    with pytest.raises(UsageError, match=r"--staging-dir: applies to an --output_path in a bucket"):
        ConvertOptions(tiny_tree, tmp_path / "out", staging_dir=tmp_path / "staging")
