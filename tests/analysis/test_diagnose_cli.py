"""`stallscope diagnose` end to end: the report, --json, --fix closing the loop, one-line errors."""

from __future__ import annotations

import json
import os

import pytest

from stallscope.cli.main import main
from stallscope.pipeline.config import PipelineConfig


def _tree(root):
    """72 photo-like JPEGs of 640x480, so decoding is real work next to a 30 ms emulated step."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    y, x = np.mgrid[0:480, 0:640]
    for c in range(3):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True)
        for i in range(24):
            base = rng.uniform(0, 255, 3)
            pixels = base + x[..., None] * rng.uniform(-0.5, 0.5, 3) + rng.normal(0, 20, (480, 640, 3))
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"{i:02d}.jpg", quality=90)
    return root


@pytest.mark.whole_machine  # the fix's re-run must show a lower input share: a test beside it would take its cores
def test_fix_lowers_the_input_share_and_saves_a_config_train_reads(tmp_path, capsys, monkeypatch):
    from stallscope.pipeline import sources

    data = _tree(tmp_path / "data")
    fixed = tmp_path / "out" / "fixed.json"
    opened = []
    real_open_source = sources.open_source
    monkeypatch.setattr(sources, "open_source", lambda *args: opened.append(args) or real_open_source(*args))
    code = main(["diagnose", "--dataset_path", str(data), "--pipeline", "seed", "--batch-size", "4",
                 "--image-size", "64", "--accelerator", "emulated:30ms", "--probe-steps", "18",
                 "--fix", "--fixed-config", str(fixed), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert len(opened) == 1, "the diagnosis and the fix's re-run list the tree once between them"
    report = json.loads(captured.out)
    assert report["verdict"] in ("highly", "moderately")
    assert report["cause"] == "preprocessing"
    assert 0.0 <= report["input_share"] <= 1.0
    phase = report["phases"][0]
    assert phase["what_if"]["devices"] and phase["what_if"]["cores"]
    assert report["probes"]["cold"]["io_per_image"]["storage_bytes"] > 0
    fix = report["fix"]
    applied = {a["key"] for a in fix["applied"]}
    # a parallel map gains only where a core is free: on a machine kept busy by others it is only checked
    busy = report["probes"]["warm"]["other_cores_busy"] >= 0.5
    assert "shuffle_encoded" in applied  # with the prefetch it lets work: one fix, priced together
    pair = next(a for a in fix["applied"] if a["key"] == "shuffle_encoded")
    assert pair["knobs"] == {"shuffle_at": "encoded", "prefetch": -1} and pair["predicted_gain"] >= 0.05
    assert "parallel_map" in applied or (busy and any("Decode in parallel" in n for n in report["notes"]))
    before, after = fix["phases"][0]["before"], fix["phases"][0]["after"]
    assert after["input_share"] < before["input_share"]
    assert fix["held"] is True
    # the predicted column is the what-if's '+0 cores' row: one model, the same free cores
    predicted = fix["phases"][0]["predicted"]
    plus_zero = phase["what_if"]["cores"][0]
    assert predicted["images_per_second"] == pytest.approx(plus_zero["images_per_second"])
    assert predicted["input_share"] == pytest.approx(plus_zero["input_share"])
    # the saved file is what `train --pipeline-config FILE` loads
    config = PipelineConfig.load(fixed)
    assert config.map_parallelism == (-1 if "parallel_map" in applied else None)
    assert config.prefetch == -1 and config.shuffle_at == "encoded"
    assert config.batch_size == 4 and config.image_size == 64
    assert fix["config_path"] == str(fixed)
    run_dir = tmp_path / "run"
    assert main(["train", "--dataset-path", str(data), "--pipeline-config", str(fixed), "--steps", "3",
                 "--accelerator", "emulated:1000", "--log-path", str(run_dir)]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["pipeline"]["requested"] == config.to_dict()


def test_terminal_report_names_the_split_and_io(tmp_path, capsys):
    data = _tree(tmp_path / "data")
    code = main(["diagnose", "--dataset-path", str(data), "--pipeline", "tuned", "--batch-size", "4",
                 "--image-size", "64", "--accelerator", "emulated:40ms", "--probe-steps", "9", "--no-cold-cache"])
    out = capsys.readouterr().out
    assert code == 0
    for text in ("pipeline alone", "compute", "preprocessing", "fetch", "I/O per image, warm cache",
                 "what if the device ran at", "knee"):
        assert text in out, text
    assert "cold cache" not in out.split("phase")[0]
    assert "mean of 18 steps" in out  # 72 images in batches of 4: the window is the whole 18-step epoch, not 9


def _exit_code(argv) -> int:
    """main's return value, or the exit code argparse ends with."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("argv, message", [
    (["--probe-steps", "0"], "--probe-steps"),
    (["--probe-steps", "1", "--accelerator", "emulated:1000"], "--probe-steps"),
    (["--accelerator", "emulated:fast"], "--accelerator"),
    (["--json", "--markdown"], "--markdown"),
])
def test_bad_flags_end_in_one_line(tmp_path, capsys, argv, message):
    code = _exit_code(["diagnose", "--dataset-path", str(tmp_path)] + argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and message in err


def test_missing_dataset_is_one_line(tmp_path, capsys):
    code = main(["diagnose", "--dataset-path", str(tmp_path / "nope"), "--accelerator", "emulated:1000"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "nope" in err


def test_diagnose_under_a_cpu_quota_counts_the_quota_and_says_it_ran_out(tmp_path, capsys, cpu_cgroup):
    """A diagnosis inside a container limited to a quarter of a CPU: its cores are the quota, not the
    machine's CPUs, and it says the quota ran out during the pipeline probe. The test process itself
    moves into a fresh cgroup for the run and back out before it is removed."""
    data = _tree(tmp_path / "data")
    cpu_cgroup.limit(0.25)
    cpu_cgroup.procs.write_text(str(os.getpid()))
    try:
        code = main(["diagnose", "--dataset_path", str(data), "--pipeline", "tuned", "--batch-size", "4",
                     "--image-size", "32", "--accelerator", "emulated:1ms", "--probe-steps", "6", "--json"])
    finally:
        cpu_cgroup.home.write_text(str(os.getpid()))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    warm = report["probes"]["warm"]
    assert warm["cores"] == 0.25 and warm["throttled_share"] >= 0.2
    assert any("CPU quota (0.25 CPUs' worth) ran out in" in note for note in report["notes"]), report["notes"]
    assert "quota_pool" not in {a["key"] for a in report["advice"]}  # tuned runs on the quota's pool already


def test_fix_under_a_cpu_quota_runs_the_pipeline_on_a_pool_of_the_quotas_cores(tmp_path, capsys, cpu_cgroup):
    """The seed pipeline in a container limited to half a CPU on a machine of more: its pipeline ran on
    TF's pool of a thread per CPU, the quota ran out, and the fix gives it a pool of the quota's one
    core, saved where `train --pipeline-config` reads it."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs to limit the run to fewer")
    data = _tree(tmp_path / "data")
    fixed = tmp_path / "fixed.json"
    cpu_cgroup.limit(0.5)
    cpu_cgroup.procs.write_text(str(os.getpid()))
    try:
        code = main(["diagnose", "--dataset_path", str(data), "--pipeline", "seed", "--batch-size", "4",
                     "--image-size", "32", "--accelerator", "emulated:1ms", "--probe-steps", "6", "--json",
                     "--fix", "--fixed-config", str(fixed)])
    finally:
        cpu_cgroup.home.write_text(str(os.getpid()))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    pool = next(a for a in report["advice"] if a["key"] == "quota_pool")
    assert pool["knobs"] == {"private_threadpool_size": 1}
    assert "options.threading.private_threadpool_size = 1" in pool["code"]
    assert "ran out in" in pool["evidence"] and "on " in pool["evidence"]
    assert "quota_pool" in {a["key"] for a in report["fix"]["applied"]}
    assert PipelineConfig.load(fixed).private_threadpool_size == 1
