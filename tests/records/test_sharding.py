"""Shard planning is pure arithmetic: no files, no TensorFlow."""

import pytest

from stallscope.errors import UsageError
from stallscope.records import sharding


def test_shard_filename_and_pattern():
    name = sharding.shard_filename("train", 3, 16)
    assert name == "train-00003-of-00016.tfrecord"
    assert sharding.SHARD_NAME.match(name).group("split") == "train"
    with pytest.raises(ValueError):
        sharding.shard_filename("train", 16, 16)


def test_shuffled_is_seeded_per_split_and_a_permutation():
    items = list(range(100))
    a = sharding.shuffled(items, 0, "train")
    assert sorted(a) == items and a != items
    assert a == sharding.shuffled(items, 0, "train")
    assert a != sharding.shuffled(items, 1, "train")
    assert a != sharding.shuffled(items, 0, "validation")
    assert items == list(range(100))  # input untouched


@pytest.mark.parametrize("n, k", [(10, 3), (3, 3), (0, 1), (17, 16), (1000, 7)])
def test_ranges_by_count_cover_everything_evenly(n, k):
    ranges = sharding.ranges_by_count(n, k)
    assert len(ranges) == k
    assert [i for r in ranges for i in r] == list(range(n))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_ranges_by_size_follow_seed_000():
    sizes = [40, 30, 50, 10, 10, 10, 90, 5]
    # the seed closes a file once its bytes reach the target: 40+30 -> 70 >= 60, 50+10 -> 60, 10+10+90, 5
    assert sharding.ranges_by_size(sizes, 60) == [range(0, 2), range(2, 4), range(4, 7), range(7, 8)]
    assert sharding.ranges_by_size([10, 10], 20) == [range(0, 2)]
    assert sharding.ranges_by_size([], 20) == [range(0, 0)]
    assert sharding.ranges_by_size([5], 1000) == [range(0, 1)]


def test_chunk_ranges():
    assert sharding.chunk_ranges(range(3, 12), 4) == [range(3, 7), range(7, 11), range(11, 12)]
    assert sharding.chunk_ranges(range(0, 0), 4) == []


def test_bad_counts_are_usage_errors():
    with pytest.raises(UsageError, match="shards"):
        sharding.ranges_by_count(5, 0)
    with pytest.raises(UsageError, match="size_per_record"):
        sharding.ranges_by_size([1], 0)
