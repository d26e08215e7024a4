"""A run by epochs says how many images its steps took against those in the split, and how many were
dropped as partial batches (before: 20 of 24 trained without a word)."""

from __future__ import annotations

import json

from stallscope.pipeline.presets import get_preset
from stallscope.workload.train import PARTIAL_BATCHES, TrainOptions, run_training


def test_an_epoch_run_says_how_many_images_its_partial_batch_dropped(tiny_tree, tmp_path):
    pipeline = get_preset("seed").replace(image_size=32, batch_size=5, shuffle_buffer=0, drop_remainder=True)
    result = run_training(TrainOptions(source="files", dataset_path=tiny_tree, pipeline=pipeline, epochs=1,
                                       accelerator="emulated:2000", log_path=tmp_path / "run"))
    expected = {"images_trained": 20, "images_in_split": 24, "dropped": 4, "why_dropped": PARTIAL_BATCHES["local"]}
    assert result.summary["split_coverage"] == expected  # 3 classes x 8 images in batches of 5: 4 steps
    assert isinstance(result.summary["images"], int), "the measured steps' own count stays as it was"
    assert json.loads((tmp_path / "run" / "summary.json").read_text(encoding="utf-8"))["split_coverage"] == expected


def test_a_run_by_steps_sets_nothing_against_the_split(tiny_tree, tmp_path):
    pipeline = get_preset("seed").replace(image_size=32, batch_size=5, shuffle_buffer=0)
    result = run_training(TrainOptions(source="files", dataset_path=tiny_tree, pipeline=pipeline, steps=7,
                                       accelerator="emulated:2000", log_path=tmp_path / "run"))
    assert result.summary["split_coverage"] == {"images_trained": 35, "images_in_split": None, "dropped": None,
                                                "why_dropped": None}
