"""`diagnose --what-if-storage`: the storage section on a tiny synthetic data set, and bad values."""

from __future__ import annotations

import json

import pytest

from stallscope.cli.main import main

DIAGNOSE = ["--pipeline", "seed", "--batch-size", "4", "--image-size", "32", "--accelerator", "emulated:2000",
            "--probe-steps", "4", "--pipeline-budget", "2", "--no-cold-cache"]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    assert main(["prepare", "synthetic", "--output", str(out), "--classes", "2", "--images-per-class", "8",
                 "--long-side", "64-96", "--workers", "1"]) == 0
    return out / "train"


def _exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_named_store_prints_files_and_records_and_storage_advice(synthetic, capsys):
    code = main(["diagnose", "--dataset-path", str(synthetic), *DIAGNOSE, "--what-if-storage", "10ms,200Mbit"])
    out = capsys.readouterr().out
    assert code == 0
    assert "storage per image (modelled for tf-gcs): requests 1," in out
    table = out.split("storage what-if")[1].split("\nadvice")[0]
    rows = [line for line in table.splitlines() if line.strip().startswith("10ms,200Mbit")]
    assert len(rows) == 2
    assert "files (yours)" in rows[0] and "records" in rows[1]
    for row in rows:
        assert row.count("/s ") == 3  # sequential, parallel, enough in flight
    assert "Convert the images to TFRecord shards" in out.split("\nadvice")[1]


def test_json_has_the_per_image_figures_and_the_table(synthetic, capsys, tmp_path):
    counters = tmp_path / "counters.json"
    counters.write_text(json.dumps({"requests": 5, "connections": 1, "bytes": 100}))
    code = main(["diagnose", "--dataset-path", str(synthetic), *DIAGNOSE, "--json", "--storage-client", "s3fs",
                 "--what-if-storage", "object-store-region,0ms,unlimited", "--storage-counters", str(counters)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    storage = report["storage"]
    # the counters did not move (the data is local): requests are modelled, and the report says why
    assert storage["basis"] == "modelled" and storage["client"] == "s3fs" and storage["requests"] == 1
    assert any("did not move" in note for note in report["notes"])
    scenarios = report["storage_what_if"]["scenarios"]
    assert [s["scenario"]["name"] for s in scenarios] == ["object-store-region", "0ms,unlimited"]
    for scenario in scenarios:
        assert {f["format"] for f in scenario["formats"]} == {"files", "records"}
        for f in scenario["formats"]:
            assert f["sequential"]["images_per_second"] > 0 and 0 <= f["parallel"]["input_share"] <= 1


@pytest.mark.parametrize("argv, message", [
    (["--what-if-storage", "10parsecs"], "--what-if-storage: expected a preset"),
    (["--what-if-storage", "10ms"], "--what-if-storage: expected a bandwidth after the latency"),
    (["--storage-counters", "missing.json"], "--storage-counters"),
    (["--storage-client", "ftp"], "--storage-client"),
])
def test_bad_storage_flags_are_one_line(tmp_path, capsys, argv, message):
    code = _exit_code(["diagnose", "--dataset-path", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and message in err, err
