"""`stallscope storage probe URL`: what a store gives this machine, measured with no pipeline around
it: its round trip (one-byte GETs, one at a time) and whole-object GETs with many in flight, largest
objects first. It ends with the `--what-if-storage` spec that describes the store, so a diagnosis of
data still on local disk can be asked about the store it would move to.

Bandwidth is only named where the objects read were large (4 MiB or more on average): a GET of a
75 KB JPEG is bound by its round trip, so many of them in flight measure the requests, not the link.

Timing the requests is the client side's (storage/round_trips.py, storage's readers); reading them as
the what-if's store (the round trip less the client's own cost per request, the spec) is analysis'.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from stallscope.config import require_positive
from stallscope.errors import UsageError
from stallscope.extras import install_line
from stallscope.storage import obstore_client, request_tally
from stallscope.storage.location import RemotePath, as_path, listed_size, read_many
from stallscope.storage.round_trips import time_round_trips

# Objects at least this large on average make a transfer bandwidth-bound, not request-bound: 4 MiB at
# 1 Gbit/s is 34 ms of transfer beside a round trip of a few to tens of ms.
BANDWIDTH_OBJECT_BYTES = 4 << 20
BATCH_PER_IN_FLIGHT = 4   # objects asked for per batch, per request in flight
BATCH_BYTES = 256 << 20   # and at most about this many bytes held at once (shards of 100 MB: a few)


@dataclasses.dataclass(frozen=True)
class ProbeOptions:
    url: str
    round_trips: int = 24
    in_flight: int = 16
    seconds: float = 5.0            # the transfer's time budget
    max_bytes: int = 1 << 30        # and its byte budget

    def __post_init__(self) -> None:
        if not isinstance(as_path(self.url), RemotePath):
            raise UsageError(f"URL: expected gs://bucket/prefix or s3://bucket/prefix, got {self.url!r}")
        require_positive("--round-trips", self.round_trips)
        require_positive("--in-flight", self.in_flight)
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise UsageError(f"--seconds: expected a number of seconds above 0, got {self.seconds!r}")


@dataclasses.dataclass(frozen=True)
class StoreProbe:
    """What the store gave: its objects, round trip (ms) and transfer (bytes/s), all measured here."""

    url: str
    objects: int
    total_bytes: int
    listing_s: float
    round_trips: int
    round_trip_ms: dict[str, float | None]     # fastest tenth ("p10"), median ("p50"), "p90"
    in_flight: int
    objects_read: int
    bytes_read: int
    transfer_s: float
    get_ms_median: float | None
    latency_ms: float | None                   # the round trip less the client's own overhead per request
    bandwidth_bytes_per_s: float | None        # None: request-bound (the objects are small)
    client: str

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_read / self.transfer_s if self.transfer_s > 0 else 0.0

    @property
    def what_if_spec(self) -> str | None:
        """The `--what-if-storage` text for this store; None without a round trip."""
        from stallscope.analysis.storage_whatif import format_bandwidth, format_latency

        if self.latency_ms is None:
            return None
        if not self.bandwidth_bytes_per_s:
            return f"{format_latency(self.latency_ms)},{format_bandwidth(math.inf)}"
        megabits = self.bandwidth_bytes_per_s * 8 / 1e6  # three significant figures: it is a measurement
        return f"{format_latency(self.latency_ms)},{float(f'{megabits:.3g}'):g}Mbit"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "bytes_per_s": self.bytes_per_s, "what_if_storage": self.what_if_spec}


def probe_store(options: ProbeOptions) -> StoreProbe:
    """Lists `options.url` once, times its round trip, then reads its largest objects whole."""
    from stallscope.analysis.storage_whatif import obstore_client_for

    if not obstore_client.installed():
        raise UsageError(f"storage probe: expected the obstore package ({install_line('stores')}), "
                         "which makes and times the requests")
    started = time.perf_counter()
    files = list(as_path(options.url).walk_files())  # TensorFlow is not loaded to list and read a bucket
    listing_s = time.perf_counter() - started
    if not files:
        raise UsageError(f"{options.url}: expected objects below this prefix, found none")
    sizes = {str(f): listed_size(f) or 0 for f in files}
    trips = time_round_trips([str(f) for f in files], count=options.round_trips,
                             budget_s=max(3.0, options.round_trips * 1.0))
    client = obstore_client_for(files[0].scheme)
    fastest = trips.percentile_ms(0.1)
    read, got, seconds, gets = _transfer(sorted(files, key=lambda f: -sizes[str(f)]), sizes, options)
    large = read and got / read >= BANDWIDTH_OBJECT_BYTES
    return StoreProbe(
        url=options.url, objects=len(files), total_bytes=sum(sizes.values()), listing_s=listing_s,
        round_trips=trips.requests,
        round_trip_ms={"p10": fastest, "p50": trips.percentile_ms(0.5), "p90": trips.percentile_ms(0.9)},
        in_flight=options.in_flight, objects_read=read, bytes_read=got, transfer_s=seconds,
        get_ms_median=gets.percentile_ms(0.5),
        latency_ms=round(max(0.0, fastest - client.request_overhead_ms), 1) if fastest is not None else None,
        bandwidth_bytes_per_s=got / seconds if large and seconds > 0 else None, client=client.name)


def _transfer(files: list[RemotePath], sizes: dict[str, int], options: ProbeOptions):
    """(objects, bytes, seconds, their tally): whole objects, `in_flight` at once, in batches of at most
    BATCH_BYTES, until the time or byte budget is spent or every object was read."""
    before = request_tally.snapshot()
    started = time.perf_counter()
    read = got = 0
    for batch in _batches(files, sizes, options.in_flight * BATCH_PER_IN_FLIGHT):
        data = read_many(batch, options.in_flight)
        read += len(data)
        got += sum(len(d) for d in data)
        del data
        if time.perf_counter() - started >= options.seconds or got >= options.max_bytes:
            break
    return read, got, time.perf_counter() - started, request_tally.snapshot().since(before)


def _batches(files: list[RemotePath], sizes: dict[str, int], most: int):
    batch: list[RemotePath] = []
    held = 0
    for path in files:
        batch.append(path)
        held += sizes[str(path)]
        if len(batch) >= most or held >= BATCH_BYTES:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch
