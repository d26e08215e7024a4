"""The training loop end to end on tiny data: summary, run directory, chain, profile, timing, model runs."""

import json

import pytest

from stallscope.errors import DataError, UsageError
from stallscope.workload import rundir
from stallscope.workload.train import TrainOptions, run_training

SUMMARY_KEYS = {
    "images_per_second", "step_time_ms", "input_wait_ms", "compute_ms", "input_share", "verdict",
    "step_time_p50_ms", "step_time_p90_ms", "steps", "batch_size", "pipeline", "model", "source",
    "accelerator", "dataset_path", "dataset_size", "stallscope_version", "cpu", "io",
}


@pytest.fixture(scope="module")
def seed_run(tiny_tree, make_pipeline, tmp_path_factory):
    """The seed pipeline from files against an emulated 20 ms device, steps 4..9 profiled."""
    lines = []
    result = run_training(
        TrainOptions(source="files", dataset_path=tiny_tree, pipeline=make_pipeline("seed"), steps=12,
                     accelerator="emulated:20ms", log_path=tmp_path_factory.mktemp("seed_run"),
                     profile_steps="4:9", log_every=5),
        on_step=lambda progress: lines.append(progress.log_line) if progress.log_line else None,
    )
    return result, lines


def test_summary_has_the_fields_with_sane_values(seed_run):
    result, _ = seed_run
    summary = json.loads((result.run_dir / rundir.SUMMARY_NAME).read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary == result.summary
    assert summary["steps"] == 12 and summary["warmup_steps"] == 2 and summary["batch_size"] == 4
    assert 0 <= summary["input_share"] <= 1
    assert summary["verdict"] in ("highly", "moderately", "not")
    assert summary["step_time_ms"] == pytest.approx(summary["input_wait_ms"] + summary["compute_ms"], rel=1e-6)
    assert summary["step_time_p50_ms"] <= summary["step_time_p90_ms"]
    assert summary["images_per_second"] == pytest.approx(4 / (summary["step_time_ms"] / 1000), rel=1e-6)
    assert summary["accelerator"]["spec"] == "emulated:20ms"
    assert summary["model"] is None  # an emulated device builds no model
    assert summary["source"]["kind"] == "files" and summary["source"]["examples"] == 24
    assert summary["io"]["rchar"] > 0 and summary["io"]["per_image"]["files_opened"] == pytest.approx(1.0)
    assert summary["cpu"]["cores"] >= 1 and summary["cpu"]["samples"] >= 1


def test_run_directory_follows_the_contract(seed_run):
    result, lines = seed_run
    steps = rundir.read_steps(result.run_dir)
    assert [s.step for s in steps] == list(range(1, 13))
    assert [s.warmup for s in steps] == [True, True] + [False] * 10
    assert all(s.images == 4 and s.compute_ms >= 19 for s in steps)
    pipeline = rundir.read_json(result.run_dir, rundir.PIPELINE_NAME)
    assert pipeline["requested"]["preset"] == "seed" and pipeline["ran"]
    resources = rundir.read_json(result.run_dir, rundir.RESOURCES_NAME)
    assert resources["samples"] and resources["io"]["syscr"] > 0
    assert lines == [l for l in lines if l.startswith("step ")] and len(lines) == 2
    assert "input wait" in lines[0]
    assert list((result.run_dir / "train").glob("events.out.tfevents.*"))


def test_seed_preset_runs_sequentially(seed_run):
    """TF's rewrites are off: the chain as run has no parallel map, fused map-and-batch or injected prefetch."""
    ran = seed_run[0].summary["pipeline"]["ran"]
    assert "Map" in ran and "Batch" in ran and "Shuffle" in ran
    assert not {"ParallelMap", "MapAndBatch", "ParallelBatch", "Prefetch", "ParallelInterleave"} & set(ran)


def test_chain_as_written_and_as_run_show_tf_rewrites(tiny_tree, make_pipeline, tmp_path):
    """With TF's map_parallelization back on, the chain as run differs from the chain as written."""
    config = make_pipeline("seed").replace(map_parallelization=True)
    result = run_training(TrainOptions(source="files", dataset_path=tiny_tree, pipeline=config, steps=3,
                                       accelerator="emulated:5ms", log_path=tmp_path / "run"))
    pipeline = rundir.read_json(result.run_dir, rundir.PIPELINE_NAME)
    assert "Map" in pipeline["written"] and "ParallelMap" not in pipeline["written"]
    assert "ParallelMap" in pipeline["ran"] and "Map" not in pipeline["ran"]
    assert result.summary["pipeline"]["written"] == pipeline["written"]


def test_profile_is_read_by_xprof_with_step_time(seed_run):
    from xprof.convert import raw_to_tool_data

    result, _ = seed_run
    files = rundir.profile_files(result.run_dir)
    assert len(files) == 1 and result.summary["profile"]["captured_steps"] == 6
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(files[0])], "input_pipeline_analyzer", {})
    text = data.decode() if isinstance(data, bytes) else data
    assert "No step time measured" not in text
    analysis = json.loads(text)[1]
    assert float(analysis["p"]["steptime_ms_average"]) >= 19.0  # the emulated 20 ms wait is in the step
    step_names = [row["c"][0]["v"] for row in analysis["rows"]]
    assert step_names and all(name.startswith("train ") for name in step_names)


def test_emulated_step_time_matches_the_speed(tiny_tree, make_pipeline, tmp_path, monkeypatch):
    """emulated:200 images/s with batches of 4 is 20 ms a step; fast input adds little. No model is built."""
    import stallscope.workload.models as models

    def no_model(*args, **kwargs):
        raise AssertionError("an emulated run must not build a model")

    monkeypatch.setattr(models, "build_model", no_model)
    pipeline = make_pipeline("tuned", cache="memory", cache_at="decoded")
    result = run_training(TrainOptions(source="files", dataset_path=tiny_tree, pipeline=pipeline, steps=30,
                                       accelerator="emulated:200", log_path=tmp_path / "run", warmup_steps=6))
    stats = result.stats
    assert result.model is None
    assert 19.5 <= stats.compute_ms <= 40.0  # generous: the machine is shared
    assert 19.5 <= stats.step_time_ms <= 60.0
    assert stats.images_per_second == pytest.approx(4000 / stats.step_time_ms)


def test_records_source_and_epochs(records_dir, make_pipeline, tmp_path):
    result = run_training(TrainOptions(source="records", dataset_path=records_dir, pipeline=make_pipeline("tuned"),
                                       epochs=2, accelerator="emulated:1ms", log_path=tmp_path / "run"))
    assert result.summary["source"]["kind"] == "records" and result.summary["source"]["files"] == 2
    assert result.summary["steps"] == 12 and result.summary["epochs_started"] == 2  # 24 images / 4, twice
    assert result.summary["io"]["files_opened"] == 4
    assert "TFRecord" in result.summary["pipeline"]["ran"]


def test_dataset_size_limits_each_epoch(tiny_tree, make_pipeline, tmp_path):
    result = run_training(TrainOptions(source="files", dataset_path=tiny_tree, pipeline=make_pipeline("seed"),
                                       dataset_size=8, accelerator="emulated:1ms", log_path=tmp_path / "run"))
    assert result.summary["steps"] == 2 and result.summary["dataset_size"] == 8


def test_prebuilt_dataset_is_used_as_given(tiny_tree, make_pipeline, tmp_path):
    import tensorflow as tf

    images = tf.zeros((3, 32, 32, 3))
    labels = tf.one_hot([0, 1, 2], 3)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat(5)
    result = run_training(TrainOptions(source="files", dataset_path=tiny_tree, pipeline=make_pipeline("seed"),
                                       accelerator="emulated:1ms", log_path=tmp_path / "run"), dataset=dataset)
    assert result.summary["steps"] == 5 and all(s.images == 3 for s in result.steps)


@pytest.mark.parametrize("changes, error, match", [
    ({"dataset_size": 1000}, UsageError, "--dataset-size"),
    ({"validation_path": "x"}, UsageError, "emulated accelerator has no model"),
    ({"learning_rate": 0}, UsageError, "learning_rate"),
    ({"profile_steps": "9:3"}, UsageError, "--profile-steps"),
    ({"source": "tapes"}, UsageError, "source"),
])
def test_bad_options_are_named(tiny_tree, make_pipeline, tmp_path, changes, error, match):
    values = dict(source="files", dataset_path=tiny_tree, pipeline=make_pipeline("seed"),
                  accelerator="emulated:1ms", log_path=tmp_path / "run", steps=2)
    values.update(changes)
    with pytest.raises(error, match=match):
        run_training(TrainOptions(**values))


def test_no_full_batch_is_a_data_error(tiny_tree, make_pipeline, tmp_path):
    pipeline = make_pipeline("tuned", batch_size=64)
    with pytest.raises(DataError, match="no full batch"):
        run_training(TrainOptions(source="files", dataset_path=tiny_tree, pipeline=pipeline,
                                  accelerator="emulated:1ms", log_path=tmp_path / "run"))


def test_steps_csv_counts_each_steps_reads(seed_run):
    """Local JPEGs: each step's read calls and bytes read by the process ('process' basis), in steps.csv."""
    result, _ = seed_run
    steps = rundir.read_steps(result.run_dir)
    assert all(s.requests is not None and s.bytes_read is not None for s in steps)
    assert sum(s.bytes_read for s in steps) > 0
    assert result.summary["step_io"]["basis"] == "process"
    assert "page-cache hits included" in result.summary["step_io"]["meaning"]


def test_the_summary_says_what_was_fetched_per_image_trained(seed_run):
    """One definition of per image: everything fetched over the images the steps took; read amplification
    is bytes fetched per byte trained: at least each JPEG once here (the process's other reads count too:
    against 2 KB images they weigh; against real ones they do not)."""
    fetched = seed_run[0].summary["fetched"]
    assert fetched["basis"] == "process" and fetched["images_trained"] == 48
    assert fetched["per_image"].startswith("per image trained")
    assert fetched["requests_per_image"] == pytest.approx(fetched["requests"] / 48)
    assert fetched["bytes_trained"] == pytest.approx(48 * seed_run[0].summary["source"]["bytes"] / 24)
    assert fetched["read_amplification"] >= 0.9


def test_a_short_run_warns_that_it_is_too_short_to_trust(seed_run):
    """12 steps of ~20 ms: the run reports the precision it reached and says it is too short."""
    from stallscope.cli.train import format_summary

    summary = seed_run[0].summary
    precision = summary["precision"]
    assert precision["stopped_by"] == "steps" and precision["target"] is None
    assert precision["measured_s"] < 1 and precision["warning"].startswith("too short to trust")
    lines = format_summary(summary)
    assert lines[0].startswith("warning         too short to trust"), lines  # the warning leads its figures
    throughput = next(line for line in lines if line.startswith("throughput"))
    assert f"first {summary['warmup_steps']} step(s), warm-up" in throughput and "left out" in throughput, throughput
    assert any(line.startswith("fetched ") and "per image trained; read amplification" in line for line in lines)
