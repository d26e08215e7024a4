"""The pass length and shuffle refill of a dataset of your own, read from its chain of stages."""

from __future__ import annotations

import time

import pytest
import tensorflow as tf

from stallscope.analysis.dataset_passes import Passes, passes

DATA = tf.data.Dataset.range(100)


def _made(x):
    return x * 2


def _fusion(dataset, on: bool):
    options = tf.data.Options()
    options.experimental_optimization.shuffle_and_repeat_fusion = on
    return dataset.with_options(options)


@pytest.mark.parametrize("dataset, expected", [
    # finite: a pass is the dataset; the shuffle after the map takes its buffer in again at each pass
    (DATA.map(_made).shuffle(50).batch(8), Passes(13, 50, True, 50, 100)),
    # repeated after the batch, as Keras users write it for steps_per_epoch: the pass is under the repeat
    (DATA.map(_made).shuffle(50).batch(8).repeat().prefetch(2), Passes(13, 50, True, 50, 100)),
    # the repeat right over the shuffle: TF fuses them and the fused stage keeps its buffer across passes
    (DATA.map(_made).shuffle(50).repeat().batch(8), Passes(13, 50, True, 0, 100)),
    # ... unless the buffer is larger than a pass
    (DATA.map(_made).shuffle(200).repeat().batch(8), Passes(13, 200, True, 100, 100)),
    # a shuffle of names or records, before the map
    (DATA.shuffle(50).map(_made).batch(8), Passes(13, 50, False, 50, 100)),
    # a shuffle over the repeated stream never empties
    (DATA.map(_made).repeat().shuffle(50).batch(8), Passes(13)),
    # batches of batches
    (DATA.batch(5).batch(4).repeat(), Passes(5)),
    (DATA.padded_batch(10).repeat(), Passes(10)),
    # a filter makes a pass's length unknown, under the repeat and between it and the top
    (DATA.filter(lambda x: x > 3).batch(8).repeat(), Passes(None)),
    (DATA.repeat().filter(lambda x: x > 3).batch(8), Passes(None)),
    (DATA.batch(2).repeat().unbatch(), Passes(None)),
])
def test_passes_read_from_the_chain(dataset, expected):
    assert passes(dataset) == expected


def test_the_fusion_option_decides_whether_the_buffer_is_kept():
    fused = DATA.map(_made).shuffle(50).repeat().batch(8)
    assert passes(_fusion(fused, True)).refill == 0
    assert passes(_fusion(fused, False)).refill == 50
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    assert passes(fused.with_options(options)).refill == 50


def test_the_refill_share_is_of_a_pass():
    assert passes(DATA.map(_made).shuffle(50).batch(8).repeat()).refill_share == 0.5
    assert passes(DATA.map(_made).shuffle(5).batch(8)).refill_share == 0.05
    assert Passes(None, 50, True, 50, None).refill_share == 0.0


def _first_batches_ms(dataset, count: int) -> list[float]:
    iterator, times = iter(dataset), []
    for _ in range(count):
        started = time.perf_counter()
        next(iterator)
        times.append((time.perf_counter() - started) * 1e3)
    return times


def test_what_is_read_matches_what_tf_runs():
    """TF itself: the shuffle under a batch and a repeat waits for its refill at each pass start; fused
    with the repeat right over it, it does not."""
    def slow(x):
        time.sleep(0.004)
        return x
    made = DATA.map(lambda x: tf.numpy_function(slow, [x], tf.int64, stateful=False))
    no_work_ahead = tf.data.Options()  # no prefetch TF injects, which would start the refill early
    no_work_ahead.experimental_optimization.inject_prefetch = False
    no_work_ahead.autotune.enabled = False
    refilling = made.shuffle(50).batch(5).repeat().with_options(no_work_ahead)
    kept = made.shuffle(50).repeat().batch(5).with_options(no_work_ahead)
    assert passes(refilling).refill == 50 and passes(kept).refill == 0
    # the second pass starts at batch 20: the refill sleeps 50 x 4 ms = 200 ms at least before it; a
    # batch of the kept buffer takes one of 5 elements, 20 ms
    assert _first_batches_ms(refilling, 21)[20] > 150
    assert _first_batches_ms(kept, 21)[20] < 150


def _shards(folder, counts: tuple[int, ...]) -> list[str]:
    paths = []
    for index, count in enumerate(counts):
        path = folder / f"part-{index}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for i in range(count):
                writer.write(b"%d" % i)
        paths.append(str(path))
    return paths


def test_a_pass_over_records_is_counted_where_tf_knows_no_length(tmp_path):
    """TF gives a TFRecord reader no length: the records of its local shards are counted, read one by
    one, in parallel or through an interleave over `list_files`."""
    files = _shards(tmp_path, (30, 20, 50))
    parse = tf.strings.length
    for read in (tf.data.TFRecordDataset(files), tf.data.TFRecordDataset(files, num_parallel_reads=2),
                 tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"), shuffle=False).interleave(
                     tf.data.TFRecordDataset, num_parallel_calls=2)):
        assert int(read.cardinality()) < 0
        assert passes(read.map(parse).shuffle(40).batch(8).repeat()) == Passes(13, 40, True, 40, 100)
        assert passes(read.map(parse).shuffle(200).batch(8)) == Passes(13, 200, True, 100, 100)
        assert passes(read.batch(7).repeat().prefetch(1)) == Passes(15)
    # list_files shuffles the names by default: a shuffle with no map under it, which refills at no cost
    names = tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord")).interleave(tf.data.TFRecordDataset)
    assert passes(names.batch(7).repeat()) == Passes(15, 3, False, 3, 3)
    # a filter, a take, or a compressed shard: not counted
    reader = tf.data.TFRecordDataset(files)
    assert passes(reader.filter(lambda r: True).map(parse).shuffle(40).batch(8).repeat()).steps is None
    assert passes(reader.take(10).map(parse).batch(8).repeat()).steps is None
    assert passes(reader.map(parse).take(10).batch(4)).steps is None  # not the 25 batches of all 100
    assert passes(reader.map(parse).batch(4).repeat().take(1000)).steps == 25  # a take above the repeat: passes stay
    gz = tmp_path / "gz.tfrecord"
    with tf.io.TFRecordWriter(str(gz), options="GZIP") as writer:
        writer.write(b"x")
    assert passes(tf.data.TFRecordDataset([str(gz)], compression_type="GZIP").batch(2).repeat()).steps is None


def _read(x):
    return tf.strings.as_string(x), x  # stands for tf.io.read_file(path): encoded bytes beside a label


def test_a_shuffle_of_what_a_map_read_holds_encoded_elements():
    """A map that reads files (strings out) decodes nothing: the shuffle over it holds encoded bytes,
    as one over file names does (the user's `map(read).shuffle(n).map(decode)`)."""
    found = passes(DATA.map(_read).shuffle(50).map(lambda e, y: (tf.strings.length(e), y)).batch(8).repeat())
    assert found == Passes(13, 50, False, 50, 100)


def test_a_shuffle_under_a_cache_runs_only_in_the_first_pass():
    """`shuffle(n).map(decode).cache().repeat()`: every pass after the first comes from the cache, so the
    shuffle takes nothing in again at the pass starts."""
    found = passes(DATA.map(_read).shuffle(100).map(lambda e, y: (tf.fill([4, 4, 3], 1.0), y)).cache().repeat()
                   .batch(8))
    assert found.refill == 0 and found.shuffle_buffer == 100
