"""The requests stallscope's own reader counts as it makes them: what `diagnose` measures of a bucket
that keeps no counters a diagnosis can read."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from stallscope.storage import request_tally
from stallscope.storage.request_tally import RequestTally


def test_each_request_is_counted_with_its_bytes_and_time():
    before = request_tally.snapshot()
    assert request_tally.timed(lambda: b"x" * 1000) == b"x" * 1000
    request_tally.timed(lambda: time.sleep(0.02) or b"")
    request_tally.timed(lambda: {"size": 7}, lambda _: 0)  # a HEAD: no body
    with pytest.raises(OSError):
        request_tally.timed(lambda: (_ for _ in ()).throw(OSError("refused")))  # a failure is not counted
    made = request_tally.snapshot().since(before)
    assert made.requests == 3 and made.bytes == 1000
    assert [size for _, size in made.samples] == [1000, 0, 0]
    assert made.samples[1][0] >= 0.02 and made.seconds >= 0.02
    assert made.percentile_ms(0.9) > 10.0 > 1.0 > made.percentile_ms(0.5)


def test_since_keeps_only_the_later_requests_and_refuses_them_out_of_order():
    earlier = RequestTally(2, 200, 0.3, ((0.1, 100), (0.2, 100)))
    later = RequestTally(5, 1200, 1.3, ((0.1, 100), (0.2, 100), (0.3, 0), (0.4, 500), (0.3, 500)))
    made = later.since(earlier)
    assert (made.requests, made.bytes) == (3, 1000) and made.seconds == pytest.approx(1.0)
    assert made.samples == ((0.3, 0), (0.4, 500), (0.3, 500))
    assert earlier.since(earlier).samples == ()
    with pytest.raises(ValueError, match="out of order"):
        earlier.since(later)


def test_percentiles_of_the_requests_up_to_a_size():
    samples = tuple((ms / 1000, 75_000) for ms in range(10, 110)) + ((0.5, 16 << 20),)
    tally = RequestTally(len(samples), sum(size for _, size in samples), 0.0, samples)
    assert tally.percentile_ms(0.5, most_bytes=100_000) == pytest.approx(59.5)
    assert tally.percentile_ms(0.1, most_bytes=100_000) == pytest.approx(19.9, abs=0.1)
    assert tally.percentile_ms(0.99) > tally.percentile_ms(0.99, most_bytes=100_000)  # with the 16 MB block
    assert tally.percentile_ms(0.5, most_bytes=10) is None
    assert RequestTally().percentile_ms(0.5) is None


def _child_requests(queue) -> None:
    queue.put(request_tally.snapshot().requests)


def test_a_forked_child_counts_its_own_requests_only():
    request_tally.timed(lambda: b"parent")
    assert request_tally.snapshot().requests >= 1
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_requests, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=30) == 0
    finally:
        child.join(timeout=30)
