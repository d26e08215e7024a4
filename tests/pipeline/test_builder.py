"""build_dataset: every preset over every source yields correct, correctly labelled batches."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from stallscope.config import AUTOTUNE
from stallscope.errors import UsageError
from stallscope.pipeline.builder import build_dataset, build_decode_limit_dataset
from stallscope.pipeline.presets import PRESETS
from stallscope.pipeline.sources import open_source

SIZE = 32


def small(config, **changes):
    return config.replace(image_size=SIZE, batch_size=4, **changes)


def collect(dataset):
    images, labels = [], []
    for x, y in dataset:
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


def assert_labelled(images, labels, num_classes, pixel_class, normalize="minus_one_one"):
    assert images.dtype == np.float32 and images.shape[1:] == (SIZE, SIZE, 3)
    assert labels.dtype == np.float32 and labels.shape == (len(images), num_classes)
    assert np.all(labels.sum(axis=1) == 1.0), "every row one-hot, none all-zero"
    low, high = {"minus_one_one": (-1.0, 1.0), "zero_one": (0.0, 1.0), "none": (0.0, 255.0)}[normalize]
    assert images.min() >= low and images.max() <= high
    if normalize == "none":
        assert images.max() > 1.0, "0..255 pixels, not a normalised range"
    for image, label in zip(images, labels):
        assert pixel_class(float(image.mean()), normalize) == int(label.argmax())


@pytest.fixture(params=["files", "seed_records", "standard_records"])
def source(request, coloured_tree):
    if request.param == "files":
        return open_source("files", coloured_tree)
    return open_source("records", request.getfixturevalue(request.param))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_and_source_yields_labelled_batches(preset, source, pixel_class):
    images, labels = collect(build_dataset(small(PRESETS[preset]), source))
    expected = 12 if preset == "seed" else 12 // 4 * 4  # seed keeps the partial batch; 12 divides anyway
    assert len(images) == expected
    assert_labelled(images, labels, 3, pixel_class, PRESETS[preset].normalize)
    assert sorted(labels.argmax(axis=1).tolist()) == [0] * 4 + [1] * 4 + [2] * 4


def test_resize_casting_small_images_first_gives_identical_pixels():
    from stallscope.pipeline import stages

    rng = np.random.default_rng(0)
    for shape in ((24, 40, 3), (64, 80, 3)):  # below and above the float-first threshold at 32
        image = tf.constant(rng.integers(0, 256, shape, dtype=np.uint8))
        expected = tf.image.resize(image, [SIZE, SIZE]).numpy()
        np.testing.assert_array_equal(stages.resize(image, SIZE).numpy(), expected)
        np.testing.assert_array_equal(stages.resize(tf.cast(image, tf.float32), SIZE).numpy(), expected)


def test_seed_keeps_the_last_partial_batch_and_tuned_drops_it(coloured_tree):
    source = open_source("files", coloured_tree)
    seed = [int(x.shape[0]) for x, _ in build_dataset(PRESETS["seed"].replace(image_size=SIZE, batch_size=5), source)]
    tuned = [int(x.shape[0]) for x, _ in build_dataset(PRESETS["tuned"].replace(image_size=SIZE, batch_size=5), source)]
    assert seed == [5, 5, 2] and tuned == [5, 5]


@pytest.mark.parametrize(
    "changes",
    [
        {"decode": "crop"},
        {"decode": "scaled"},
        {"cache": "memory", "cache_at": "encoded"},
        {"cache": "memory", "cache_at": "decoded"},
        {"shuffle_at": "encoded", "shuffle_files": True},
        {"read_parallelism": 3, "map_parallelism": 2, "deterministic": False},
        {"shuffle_buffer": 0, "prefetch": 2, "private_threadpool_size": 2, "max_intra_op_parallelism": 1},
        {"autotune": False, "read_parallelism": 2, "interleave_cycle_length": 3},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_knobs_keep_batches_correct(changes, source, pixel_class):
    images, labels = collect(build_dataset(small(PRESETS["tuned"], **changes), source))
    assert len(images) == 12
    assert_labelled(images, labels, 3, pixel_class, PRESETS["tuned"].normalize)


def test_zero_one_normalisation_and_integer_labels(coloured_tree, pixel_class):
    source = open_source("files", coloured_tree)
    config = small(PRESETS["tuned"], normalize="zero_one")
    images, labels = collect(build_dataset(config, source, one_hot=False))
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert labels.dtype == np.int32 and labels.shape == (12,)
    for image, label in zip(images, labels):
        assert pixel_class(float(image.mean()) * 255.0, "none") == int(label)


def test_file_cache_is_written_and_reused(coloured_tree, tmp_path, pixel_class):
    source = open_source("files", coloured_tree)
    config = small(PRESETS["tuned"], cache="file", cache_path=str(tmp_path / "cache"), cache_at="decoded")
    dataset = build_dataset(config, source)
    first = collect(dataset)
    assert list(tmp_path.glob("cache*")), "the file cache exists after one epoch"
    second = collect(dataset)
    assert len(first[0]) == len(second[0]) == 12
    assert_labelled(*second, 3, pixel_class, PRESETS["tuned"].normalize)


def test_repeat_runs_past_one_epoch(coloured_tree):
    source = open_source("files", coloured_tree)
    batches = list(build_dataset(small(PRESETS["tuned"]), source, repeat=True).take(7))
    assert len(batches) == 7  # 12 images make 3 batches per epoch


def test_scaled_decode_keeps_enough_pixels_and_matches_full_decode(tmp_path):
    """A 400x300 image scaled-decoded for 64 px uses ratio 4 (short side 75 >= 64)."""
    from PIL import Image

    from stallscope.pipeline import stages

    y, x = np.mgrid[0:300, 0:400]
    pixels = np.stack([x % 256, y % 256, (x + y) % 256], axis=-1).astype(np.uint8)
    path = tmp_path / "gradient.jpg"
    Image.fromarray(pixels).save(path, quality=95)
    encoded = tf.constant(path.read_bytes())
    scaled = stages.decode_scaled(64)(encoded)
    assert scaled.shape == (75, 100, 3)
    assert stages.decode_scaled(300)(encoded).shape == (300, 400, 3)  # no ratio fits: full size
    full = stages.resize(stages.decode_full(encoded), 64)
    small_image = stages.resize(scaled, 64)
    assert float(tf.reduce_mean(tf.abs(full - small_image))) < 12.0  # same picture, different filter
    assert stages.decode_central_crop(encoded).shape == (300, 300, 3)


def test_out_of_range_label_fails_loudly_naming_the_record(tmp_path, record_writer):
    from stallscope.records.schema import SEED

    write_shards, solid_image = record_writer
    directory = tmp_path / "records"
    write_shards(directory, SEED, [(solid_image(20), 0), (solid_image(128), 1), (solid_image(235), 7)], shards=1)
    (directory / "labels.txt").write_text("a\nb\nc\n")  # 3 labels, but a record says 7
    source = open_source("records", directory)
    dataset = build_dataset(small(PRESETS["seed"], shuffle_buffer=0), source)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"label out of range \[0, 3\)(.|\n)*7(.|\n)*img_2.jpg"):
        collect(dataset)


def test_num_classes_smaller_than_the_labels_fails_loudly(coloured_tree):
    source = open_source("files", coloured_tree)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"label out of range \[0, 2\)(.|\n)*class_2"):
        collect(build_dataset(small(PRESETS["tuned"]), source, num_classes=2))


def test_hooks_run_at_their_points_and_unknown_points_are_rejected(coloured_tree):
    source = open_source("files", coloured_tree)
    seen = []

    def count_reads(dataset):
        return dataset.map(lambda *element: (tf.py_function(lambda: seen.append(1) or 0, [], tf.int32), element)[1])

    images, _ = collect(build_dataset(small(PRESETS["seed"]), source, extra_stages={"after_read": count_reads}))
    assert len(images) == 12 and len(seen) == 12
    with pytest.raises(UsageError, match="unknown hook point.*before_lunch"):
        build_dataset(small(PRESETS["seed"]), source, extra_stages={"before_lunch": count_reads})


def test_decode_limit_dataset_yields_resized_batches(coloured_tree):
    source = open_source("files", coloured_tree)
    encoded = [Path(p).read_bytes() for p in source.files]
    batch = next(iter(build_decode_limit_dataset(encoded, image_size=SIZE, batch_size=8, parallelism=AUTOTUNE)))
    assert batch.shape == (8, SIZE, SIZE, 3) and batch.dtype == tf.float32


def test_cycle_length_on_a_files_source_is_reported_not_silently_dropped(coloured_tree, caplog):
    source = open_source("files", coloured_tree)
    build_dataset(small(PRESETS["tuned"], interleave_cycle_length=4), source)
    assert "interleave_cycle_length=4 does not apply to a files source" in caplog.text


def test_a_decoded_cache_does_not_freeze_the_shuffle_order(coloured_tree, caplog):
    source = open_source("files", coloured_tree)
    config = small(PRESETS["tuned"], cache="memory", cache_at="decoded", shuffle_files=False).replace(batch_size=12)
    dataset = build_dataset(config, source)
    assert "shuffling the cached decoded images instead" in caplog.text
    epochs = [collect(dataset)[1].argmax(axis=1).tolist() for _ in range(4)]
    assert len({tuple(e) for e in epochs}) > 1, "each epoch is shuffled anew"


def test_training_by_steps_repeats_before_decoding_unless_decoded_images_are_shuffled(coloured_tree, standard_records):
    from stallscope.pipeline.describe import pipeline_as_built

    for source in (open_source("files", coloured_tree), open_source("records", standard_records)):
        tuned = pipeline_as_built(build_dataset(small(PRESETS["tuned"]), source, repeat=True))
        assert tuned.index("Repeat") > tuned.index("ParallelMap"), tuned  # the chain lists outermost first
        seed = pipeline_as_built(build_dataset(small(PRESETS["seed"]), source, repeat=True))
        assert seed.index("Repeat") < seed.index("Map"), seed


def test_early_repeat_keeps_whole_epochs_of_files(coloured_tree):
    source = open_source("files", coloured_tree)
    dataset = build_dataset(small(PRESETS["tuned"]), source, repeat=True, one_hot=False)
    labels = np.concatenate([y.numpy() for _, y in dataset.take(9)])  # 3 epochs of 12 images
    for epoch in labels.reshape(3, 12):
        assert sorted(epoch.tolist()) == [0] * 4 + [1] * 4 + [2] * 4


def test_skipping_before_decoding_lands_where_an_uninterrupted_pipeline_would_be(tiny_tree, tmp_path):
    from stallscope.records.convert import ConvertOptions, convert_tree

    convert_tree(ConvertOptions(tiny_tree, tmp_path / "records", shards=3, workers=1))
    for source in (open_source("files", tiny_tree), open_source("records", tmp_path / "records")):
        config = small(PRESETS["tuned"])
        whole = np.concatenate([x.numpy() for x, _ in build_dataset(config, source, repeat=True).take(10)])
        skipped = build_dataset(config, source, repeat=True, skip_examples=12).take(7)
        np.testing.assert_array_equal(np.concatenate([x.numpy() for x, _ in skipped]), whole[12:40])


def test_skipping_is_refused_where_the_order_is_decided_after_decoding(tiny_tree):
    with pytest.raises(UsageError, match="decoded images"):
        build_dataset(small(PRESETS["seed"]), open_source("files", tiny_tree), repeat=True, skip_examples=4)


def test_records_that_fit_the_shuffle_buffer_are_shuffled_whole_before_the_repeat(standard_records):
    from stallscope.pipeline.describe import pipeline_as_built

    source = open_source("records", standard_records)  # 12 records, 3 classes x 4
    dataset = build_dataset(small(PRESETS["tuned"]), source, repeat=True, one_hot=False)
    labels = np.concatenate([y.numpy() for _, y in dataset.take(9)])
    for epoch in labels.reshape(3, 12):  # whole epochs: every record once per epoch
        assert sorted(epoch.tolist()) == [0] * 4 + [1] * 4 + [2] * 4
    chain = pipeline_as_built(build_dataset(small(PRESETS["tuned"]), source, repeat=True))
    assert chain.index("Repeat") < chain.index("Shuffle")  # outermost first: the records' shuffle runs inside the repeat
    # A buffer smaller than the data set shuffles a window over the repeated stream instead.
    chain = pipeline_as_built(build_dataset(small(PRESETS["tuned"], shuffle_buffer=5), source, repeat=True))
    assert chain.index("Shuffle") < chain.index("Repeat")


def test_private_threadpool_knob_sets_the_datasets_options(source):
    """The knob the storage advice sizes reaches tf.data: a private pool of that many threads."""
    shared = build_dataset(small(PRESETS["tuned"]), source)
    private = build_dataset(small(PRESETS["tuned"], private_threadpool_size=7), source)
    assert shared.options().threading.private_threadpool_size in (None, 0)
    assert private.options().threading.private_threadpool_size == 7


@pytest.mark.parametrize("url, gcs_reader, refused", [
    ("s3://bucket/train/a/1.jpg", "tf", True),        # s3:// is always stallscope's reader
    ("gs://bucket/train/a/1.jpg", "pooled", True),
    ("gs://bucket/train/a/1.jpg", "tf", False),       # TF's own reader runs on the service's workers
])
def test_a_python_reader_is_refused_on_a_tf_data_service_in_one_line(url, gcs_reader, refused):
    """The service's workers run the dataset's graph, not this process's Python: stallscope's reader
    (a numpy_function) cannot run there, so the pipeline is refused before it is sent."""
    from stallscope.pipeline.config import PipelineConfig
    from stallscope.pipeline.presets import tuned_for_source
    from stallscope.pipeline.sources import DataSource
    from stallscope.storage import tfdata_readers
    from stallscope.storage.location import as_path

    first = as_path(url)
    source = DataSource(kind="files", path=first.parent, split="train", labels=("a",), files=(first,),
                        file_labels=(0,), schema="", num_examples=1, total_bytes=1)
    config = PipelineConfig(batch_size=1, image_size=8, shuffle_buffer=0, gcs_reader=gcs_reader,
                            data_service="127.0.0.1:5000")
    if refused:
        with pytest.raises(UsageError, match="^--data-service: the service's workers cannot run stallscope's reader"):
            build_dataset(config, source)
    else:
        tfdata_readers.require_reader(source.files, gcs_reader, config.data_service)  # nothing refused
    # `tuned` on gs:// keeps TF's reader where a service reads
    assert tuned_for_source(PRESETS["tuned"].replace(data_service="127.0.0.1:5000"), source).gcs_reader == \
        ("tf" if url.startswith("gs://") else "pooled")


def test_an_image_whose_name_is_not_utf8_is_read_like_the_others(image_tree_factory):
    root = image_tree_factory(classes=2, per_class=3)
    odd = os.path.join(os.fsencode(root / "class_00"), b"caf\xe9.jpg")  # Latin-1, as old cameras and zips write
    os.rename(root / "class_00" / "img_000.jpg", odd)
    source = open_source("files", root)
    assert os.fsencode(source.files[0]) == odd  # the name as the file system spells it

    images, labels = collect(build_dataset(small(PRESETS["seed"]), source))
    assert len(images) == 6 and sorted(labels.argmax(axis=1).tolist()) == [0, 0, 0, 1, 1, 1]
