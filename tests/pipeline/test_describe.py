"""The stage chain as written and as run: TF's rewrites are visible, and the seed preset escapes them."""

from __future__ import annotations

import pytest
import tensorflow as tf

from stallscope.pipeline.builder import build_dataset
from stallscope.pipeline.config import STATIC_OPTIMIZATIONS
from stallscope.pipeline.describe import (
    parallel_stages,
    pipeline_as_built,
    pipeline_as_run,
    pipeline_as_written,
    stage_name,
)
from stallscope.pipeline.presets import PRESETS
from stallscope.pipeline.sources import open_source

TF_DEFAULTS = {name: None for name in STATIC_OPTIMIZATIONS}


@pytest.fixture
def records(seed_records):
    return open_source("records", seed_records)


def test_seed_preset_runs_sequentially_as_written(records):
    config = PRESETS["seed"].replace(image_size=32)
    run = pipeline_as_run(build_dataset(config, records))
    assert run == ["Batch", "Shuffle", "Map", "TFRecord"]  # seed-002: map -> shuffle -> batch
    assert run == pipeline_as_written(config, records)
    assert parallel_stages(run) == []


def test_same_pipeline_with_tf_defaults_is_rewritten_behind_the_users_back(records):
    config = PRESETS["seed"].replace(image_size=32, **TF_DEFAULTS)
    dataset = build_dataset(config, records)
    assert pipeline_as_built(dataset) == ["Batch", "Shuffle", "Map", "TFRecord"]
    run = pipeline_as_run(dataset)
    assert run[0] == "Prefetch" and "ParallelMap" in run and "Map" not in run  # inject_prefetch, map_parallelization


def test_map_parallelization_alone_changes_the_chain(records):
    base = PRESETS["seed"].replace(image_size=32)
    off = pipeline_as_run(build_dataset(base, records))
    on = pipeline_as_run(build_dataset(base.replace(map_parallelization=True), records))
    assert off != on
    assert on == ["Batch", "Shuffle", "ParallelMap", "TFRecord"]


def test_map_and_batch_fusion_shows_in_the_tuned_chain(records):
    config = PRESETS["tuned"].replace(image_size=32)
    dataset = build_dataset(config, records)
    written = pipeline_as_built(dataset)
    run = pipeline_as_run(dataset)
    assert written[:3] == ["Prefetch", "Batch", "ParallelMap"]
    assert run[:2] == ["Prefetch", "MapAndBatch"]
    assert run[-4:] == ["ParallelInterleave", "TFRecord", "Shuffle", "TensorSlice"]  # shuffled shards, read in parallel


def test_files_seed_reads_inside_its_one_map(coloured_tree):
    source = open_source("files", coloured_tree)
    assert pipeline_as_written(PRESETS["seed"], source) == ["Batch", "Shuffle", "Map", "TensorSlice"]


def test_infrastructure_stages_are_hidden_unless_asked_for():
    dataset = tf.data.Dataset.range(8).map(lambda x: x + 1).batch(2)
    assert "Model" not in pipeline_as_run(dataset)
    assert "Model" in pipeline_as_run(dataset, include_infrastructure=True)


@pytest.mark.parametrize(
    ("op", "stage"),
    [("ParallelMapDatasetV2", "ParallelMap"), ("ExperimentalMapAndBatchDataset", "MapAndBatch"),
     ("ParallelInterleaveDatasetV4", "ParallelInterleave"), ("TFRecordDataset", "TFRecord"),
     ("ShuffleDatasetV3", "Shuffle")],
)
def test_stage_names_match_the_profilers_iterator_names(op, stage):
    assert stage_name(op) == stage


def test_files_read_inside_the_decode_map_unless_read_parallelism_differs(coloured_tree):
    source = open_source("files", coloured_tree)
    tuned = PRESETS["tuned"].replace(image_size=32)
    assert pipeline_as_written(tuned, source) == ["Prefetch", "Batch", "ParallelMap", "Shuffle", "TensorSlice"]
    separate = pipeline_as_written(tuned.replace(read_parallelism=8), source)
    assert separate == ["Prefetch", "Batch", "ParallelMap", "ParallelMap", "Shuffle", "TensorSlice"]
