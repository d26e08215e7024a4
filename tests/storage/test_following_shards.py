"""Each shard paired with the one its reader's slot opens next (`tfdata_readers.with_following`), so that
one's first block can be asked for before it is opened."""

from __future__ import annotations

import pytest


def _pairs(dataset) -> list[tuple[str, str]]:
    return [(a.decode(), b.decode()) for a, b in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("slots, expected", [
    (1, [("a", "b"), ("b", "c"), ("c", "d"), ("d", "")]),
    (2, [("a", "c"), ("b", "d"), ("c", ""), ("d", "")]),
    (5, [("a", ""), ("b", ""), ("c", ""), ("d", "")]),
])
def test_a_shard_is_paired_with_the_one_its_slot_reads_next(slots, expected):
    import tensorflow as tf

    from stallscope.storage import tfdata_readers

    names = ["a", "b", "c", "d"]
    assert _pairs(tfdata_readers.with_following(tf.data.Dataset.from_tensor_slices(names), slots)) == expected
    assert _pairs(tfdata_readers.following_in_list(names, slots)) == expected


def test_a_repeated_list_pairs_each_epochs_last_shards_with_the_next_epochs_first():
    """Across the repeat, in the order the graph shuffles each epoch to."""
    import tensorflow as tf

    from stallscope.storage import tfdata_readers

    names = tf.data.Dataset.from_tensor_slices(["a", "b", "c"]).shuffle(3, seed=1).repeat(3)
    pairs = _pairs(tfdata_readers.with_following(names, 1))
    order = [a for a, _ in pairs]
    assert all(sorted(order[i:i + 3]) == ["a", "b", "c"] for i in (0, 3, 6))  # each epoch whole
    assert [b for _, b in pairs] == [*order[1:], ""]
