"""Tiny data for the pipeline tests: class-coloured images, so a batch shows whether each image
still carries its own label after shuffling, and record shards in either schema."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# Grey level per class; far apart so JPEG noise never blurs them together.
CLASS_LEVELS = (20, 128, 235)


def solid_image(level: int, size=(40, 30), fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), level, np.uint8)).save(buffer, fmt)
    return buffer.getvalue()


def make_coloured_tree(root: Path, per_class: int = 4, png_every: int = 0) -> Path:
    """`{class_k}/img_i.jpg`, class k a solid grey of CLASS_LEVELS[k]; every `png_every`-th a PNG."""
    for k, level in enumerate(CLASS_LEVELS):
        folder = Path(root) / f"class_{k}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            png = png_every and i % png_every == 0
            (folder / f"img_{i}.{'png' if png else 'jpg'}").write_bytes(solid_image(level, fmt="PNG" if png else "JPEG"))
    return Path(root)


def write_shards(directory: Path, schema, examples, shards: int = 2, prefix: str = "out_") -> list[Path]:
    """Writes (image bytes, label) pairs round-robin into `shards` TFRecord files."""
    import tensorflow as tf

    from stallscope.records.schema import encode_example

    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{prefix}{i}.tfrecord" for i in range(shards)]
    writers = [tf.io.TFRecordWriter(str(p)) for p in paths]
    for i, (image, label) in enumerate(examples):
        writers[i % shards].write(encode_example(schema, image=image, label=label, filename=f"img_{i}.jpg".encode()))
    for writer in writers:
        writer.close()
    return paths


def coloured_examples(per_class: int = 4):
    return [(solid_image(level), k) for k, level in enumerate(CLASS_LEVELS) for _ in range(per_class)]


def level_to_class(mean_pixel: float, normalize: str = "minus_one_one") -> int:
    """The class whose grey level is nearest to a normalised mean pixel value."""
    raw = (mean_pixel + 1.0) * 127.5 if normalize == "minus_one_one" else mean_pixel
    return int(np.argmin([abs(raw - level) for level in CLASS_LEVELS]))


@pytest.fixture(scope="session")
def coloured_tree(tmp_path_factory) -> Path:
    """Read-only `{class_k}/*` tree: 3 classes x 4 solid-grey images, one PNG per class."""
    return make_coloured_tree(tmp_path_factory.mktemp("coloured"), per_class=4, png_every=4)


@pytest.fixture(scope="session")
def seed_records(tmp_path_factory) -> Path:
    """Read-only directory as the seeds' converter writes it: `out_N.tfrecord`, seed schema, no manifest."""
    from stallscope.records.schema import SEED

    directory = tmp_path_factory.mktemp("seed_records")
    write_shards(directory, SEED, coloured_examples(), shards=2)
    return directory


@pytest.fixture(scope="session")
def standard_records(tmp_path_factory) -> Path:
    """Read-only records directory with a manifest (standard schema, train split, 3 shards)."""
    from stallscope.records.manifest import Manifest, ShardInfo, SplitInfo, save_manifest
    from stallscope.records.schema import STANDARD

    directory = tmp_path_factory.mktemp("standard_records")
    examples = coloured_examples()
    paths = write_shards(directory, STANDARD, examples, shards=3, prefix="train-0000")
    shards = tuple(ShardInfo(p.name, len(examples[i::3]), p.stat().st_size, "") for i, p in enumerate(paths))
    save_manifest(directory, Manifest(
        schema="standard", labels=("class_0", "class_1", "class_2"),
        splits={"train": SplitInfo(len(examples), shards)}, options={},
    ))
    return directory


@pytest.fixture
def pixel_class():
    return level_to_class


@pytest.fixture
def record_writer():
    """(write_shards, solid_image): for tests that need their own odd records."""
    return write_shards, solid_image
