"""Storage per image in the diagnosis: requests, connections opened, bytes and time waiting for storage.

Where a real store (or `stallscope storage serve`) counted what it served, those counters are the
figures ("measured"): it writes a JSON file `{"requests": N, "connections": N, "bytes": N}`,
cumulative since it started, rewritten atomically as they change; `diagnose --storage-counters
FILE` reads it before and after the pipeline probe and divides the difference by the images the
probe produced. Where stallscope's own object reader did the reading (obstore, on any bucket), the
requests and bytes it counted in this process are the figures ("reader"), with the requests' times as
it saw them; connections stay modelled (it keeps them alive and is not told when one opens).
Otherwise requests and connections are modelled for the client named (`storage_whatif.StorageClient`)
from files opened and bytes ("modelled"); the local read calls stay beside them as evidence, since
they do not carry over to remote requests.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from stallscope.analysis import storage_whatif
from stallscope.errors import UsageError
from stallscope.storage.request_tally import RequestTally

COUNTER_FIELDS = ("requests", "connections", "bytes")


@dataclasses.dataclass(frozen=True)
class StorageCounters:
    """What a store served: requests, connections opened and bytes sent (cumulative)."""

    requests: int
    connections: int
    bytes: int

    def __post_init__(self) -> None:
        for name in COUNTER_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"{name}: expected an integer >= 0, got {value!r}")

    def __sub__(self, earlier: "StorageCounters") -> "StorageCounters":
        """What was served between two readings (a store restarted meanwhile gives a negative: refused)."""
        values = {name: getattr(self, name) - getattr(earlier, name) for name in COUNTER_FIELDS}
        if any(v < 0 for v in values.values()):
            raise UsageError(f"storage counters went down between two readings ({values}); was the store restarted?")
        return StorageCounters(**values)

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def load_storage_counters(path: Path | str, *, flag: str = "--storage-counters") -> StorageCounters:
    """Reads `{"requests": N, "connections": N, "bytes": N}` (other keys are ignored); one line
    naming the file and what was expected when it is missing or malformed."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{flag}: file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag}: cannot read {str(path)!r} ({exc})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag}: {str(path)!r} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{flag}: {str(path)!r}: expected a JSON object with {', '.join(COUNTER_FIELDS)}, "
                         f"got {type(data).__name__}")
    missing = [name for name in COUNTER_FIELDS if name not in data]
    if missing:
        raise UsageError(f"{flag}: {str(path)!r}: expected keys {', '.join(COUNTER_FIELDS)}, missing {', '.join(missing)}")
    try:
        return StorageCounters(**{name: data[name] for name in COUNTER_FIELDS})
    except UsageError as exc:
        raise UsageError(f"{flag}: {str(path)!r}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class StorageFigures:
    """Per image: what the store is asked for and how long the pipeline waits for it.

    basis: "measured" (requests, connections, bytes counted by the store), "reader" (requests and
        bytes counted by stallscope's reader, connections modelled) or "modelled" (for `client`, from
        files opened and bytes). wait_ms: time per image no core works for the pipeline (warm probe)
        plus what a cold page cache adds, both measured.
    read_calls / files_opened: the local figures (read syscalls, files opened), as evidence.
    request_ms_median / request_ms_p90: a request's time from asking to its last byte, as
        stallscope's reader saw it (None where another client read).
    Per image means per image trained (here, produced by the probe), as in `train` and `sweep`: what
    was fetched during the probe, read-ahead it abandoned included, over the images it took ("measured"
    and "reader"). steady_requests: for "reader", the requests per image read (per byte received, times
    the data's bytes per image), the steady rate the what-if takes, without the probe's read-ahead.
    """

    basis: str
    client: str
    requests: float
    connections: float
    bytes: float
    wait_ms: float
    read_calls: float | None
    files_opened: float | None
    request_ms_median: float | None = None
    request_ms_p90: float | None = None
    steady_requests: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measured_pattern(pattern: storage_whatif.IoPattern, delta: StorageCounters | None,
                     images: int) -> storage_whatif.IoPattern:
    """The pattern with the store's own counts per image, when the counters moved during the probe."""
    if delta is None or images <= 0 or delta.requests == 0:
        return pattern
    return dataclasses.replace(pattern, requests_per_image=delta.requests / images,
                               connections_per_image=delta.connections / images,
                               bytes_per_image=delta.bytes / images if delta.bytes else pattern.bytes_per_image)


def reader_pattern(pattern: storage_whatif.IoPattern, requests: RequestTally | None,
                   images: int) -> storage_whatif.IoPattern:
    """The pattern with the requests stallscope's reader made during the probe, where the store counted
    nothing itself and the reader made any (connections stay modelled). Requests are taken per byte
    received, times the data's bytes per image: what the reader had asked for ahead when the probe
    stopped (a shard's next 16 MB blocks, a group of JPEGs) would otherwise count against the images
    the probe took (2x the bytes per image of a 1,280-image pass of four shards)."""
    if pattern.measured or requests is None or images <= 0 or requests.requests == 0:
        return pattern
    per_image = requests.requests_per_image(pattern.bytes_per_image)
    if per_image is None:  # only requests without a body (HEADs)
        per_image = requests.requests / images
    return dataclasses.replace(pattern, requests_per_image=per_image)


def storage_figures(pattern: storage_whatif.IoPattern, client: storage_whatif.StorageClient, *,
                    wait_ms_per_image: float, read_calls: float | None = None,
                    files_opened: float | None = None, requests: RequestTally | None = None,
                    images: int = 0) -> StorageFigures:
    """The per-image figures: the store's counts where it kept them (`pattern` measured), else those
    of stallscope's reader (`requests` over `images`), else the client's model."""
    if not (wait_ms_per_image >= 0 and math.isfinite(wait_ms_per_image)):
        raise UsageError(f"wait_ms_per_image: expected a finite number >= 0, got {wait_ms_per_image!r}")
    read = requests if requests is not None and requests.requests > 0 else None
    basis = "measured" if pattern.measured else "reader" if read and images > 0 else "modelled"
    pattern = reader_pattern(pattern, read, images)
    by_reader = basis == "reader"
    return StorageFigures(
        basis=basis, client=client.name,
        requests=read.requests / images if by_reader else pattern.requests(client),
        connections=pattern.connections(client),
        bytes=read.bytes / images if by_reader else pattern.bytes_per_image, wait_ms=wait_ms_per_image,
        read_calls=read_calls, files_opened=files_opened,
        request_ms_median=read.percentile_ms(0.5) if read else None,
        request_ms_p90=read.percentile_ms(0.9) if read else None,
        steady_requests=pattern.requests(client) if by_reader else None)
