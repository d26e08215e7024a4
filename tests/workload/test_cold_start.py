"""train --cold: the data's files leave the page cache before the run where a cache across runs exists;
gs:// and s3:// say it does not apply."""

import json

from stallscope.cli.main import main
from stallscope.workload.cold_start import start_cold


def test_cold_evicts_the_local_files_and_says_so(tiny_tree, tmp_path, capsys):
    code = main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:5ms", "--steps", "3",
                 "--log_path", str(tmp_path / "run"), "--pipeline", "seed", "--image_size", "32", "--batch_size", "4",
                 "--cold"])
    out = capsys.readouterr().out
    assert code == 0
    cold = json.loads((tmp_path / "run" / "summary.json").read_text())["cold"]
    assert cold["applied"] and cold["files"] == 24 and cold["bytes"] > 0
    assert "cold start      24 file(s)" in out and "posix_fadvise DONTNEED" in out


def test_cold_is_not_applicable_to_buckets():
    for url in ("gs://data/train", "s3://data/train"):
        cold = start_cold(url, [f"{url}/a/1.jpg"])
        assert not cold.applied and cold.how.startswith(f"not applicable to {url[:5]} data")


def test_without_cold_the_summary_says_nothing_was_evicted(tiny_tree, make_pipeline, tmp_path):
    from stallscope.workload.train import TrainOptions, run_training

    result = run_training(TrainOptions(source="files", dataset_path=tiny_tree, pipeline=make_pipeline("seed"),
                                       steps=2, accelerator="emulated:5ms", log_path=tmp_path / "run"))
    assert result.summary["cold"] is None
