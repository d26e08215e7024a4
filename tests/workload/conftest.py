"""Fixtures of the workload tests: tiny data in both layouts and sources, and tiny pipelines."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stallscope.pipeline.presets import get_preset

IMAGE_SIZE = 32
BATCH = 4


def tiny_pipeline(preset: str = "tuned", **changes):
    """A preset at test scale: 32-pixel images, batches of 4, a small shuffle buffer."""
    values = {"image_size": IMAGE_SIZE, "batch_size": BATCH, "shuffle_buffer": 16, **changes}
    return get_preset(preset).replace(**values)


@pytest.fixture(scope="session")
def split_tree(tiny_tree, tmp_path_factory) -> Path:
    """`{split}/{label}/*`: 6 train and 2 validation images per class, copied from the shared tiny tree."""
    root = tmp_path_factory.mktemp("split_tree")
    for class_dir in sorted(p for p in tiny_tree.iterdir() if p.is_dir()):
        images = sorted(class_dir.iterdir())
        for split, chosen in (("train", images[:6]), ("validation", images[6:])):
            target = root / split / class_dir.name
            target.mkdir(parents=True)
            for image in chosen:
                shutil.copy(image, target / image.name)
    return root


@pytest.fixture(scope="session")
def records_dir(tiny_tree, tmp_path_factory) -> Path:
    """Two bare TFRecord shards (standard schema, no manifest) plus labels.txt, from the tiny tree."""
    import tensorflow as tf

    from stallscope.records.manifest import LABELS_NAME
    from stallscope.records.schema import STANDARD, encode_example

    root = tmp_path_factory.mktemp("records")
    labels = sorted(p.name for p in tiny_tree.iterdir() if p.is_dir())
    examples = [(path, index) for index, label in enumerate(labels) for path in sorted((tiny_tree / label).iterdir())]
    (root / LABELS_NAME).write_text("\n".join(labels) + "\n", encoding="utf-8")
    for shard in range(2):
        with tf.io.TFRecordWriter(str(root / f"train-{shard:05d}-of-00002.tfrecord")) as writer:
            for path, label in examples[shard::2]:
                writer.write(encode_example(STANDARD, image=path.read_bytes(), label=label,
                                            filename=path.name.encode(), label_text=labels[label].encode()))
    return root


@pytest.fixture(scope="session")
def make_pipeline():
    """`make_pipeline("seed", prefetch=2)`: a preset at test scale (see `tiny_pipeline`)."""
    return tiny_pipeline


@pytest.fixture(scope="session")
def colour_tree(tmp_path_factory) -> Path:
    """A learnable two-class `{label}/*` tree: 24 reddish and 24 bluish 48x48 JPEGs with pixel noise."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("colour_tree")
    rng = np.random.default_rng(0)
    for label, rgb in (("blue", (40, 40, 200)), ("red", (200, 40, 40))):
        folder = root / label
        folder.mkdir()
        for index in range(24):
            pixels = np.array(rgb) + rng.normal(0, 20, (48, 48, 3))
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"{index:03d}.jpg", quality=90)
    return root
