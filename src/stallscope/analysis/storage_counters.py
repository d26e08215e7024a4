"""Storage per image in the diagnosis: requests, connections opened, bytes and time waiting for storage.

Where a real store (or `stallscope storage serve`) counted what it served, those counters are the
figures ("measured"): it writes a JSON file `{"requests": N, "connections": N, "bytes": N}`,
cumulative since it started, rewritten atomically as they change; `diagnose --storage-counters
FILE` reads it before and after the pipeline probe and divides the difference by the images the
probe produced. Otherwise requests and connections are modelled for the client named
(`storage_whatif.StorageClient`) from files opened and bytes ("modelled"); the local read calls stay
beside them as evidence, since they do not carry over to remote requests.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from stallscope.analysis import storage_whatif
from stallscope.errors import UsageError

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

    basis: "measured" (requests, connections, bytes counted by the store) or "modelled" (for
        `client`, from files opened and bytes). wait_ms: time per image no core works for the
        pipeline (warm probe) plus what a cold page cache adds, both measured.
    read_calls / files_opened: the local figures (read syscalls, files opened), as evidence.
    """

    basis: str
    client: str
    requests: float
    connections: float
    bytes: float
    wait_ms: float
    read_calls: float | None
    files_opened: float | None

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


def storage_figures(pattern: storage_whatif.IoPattern, client: storage_whatif.StorageClient, *,
                    wait_ms_per_image: float, read_calls: float | None = None,
                    files_opened: float | None = None) -> StorageFigures:
    """The per-image figures: the pattern's measured requests if it has them, else the client's model."""
    if not (wait_ms_per_image >= 0 and math.isfinite(wait_ms_per_image)):
        raise UsageError(f"wait_ms_per_image: expected a finite number >= 0, got {wait_ms_per_image!r}")
    return StorageFigures(
        basis="measured" if pattern.measured else "modelled", client=client.name,
        requests=pattern.requests(client), connections=pattern.connections(client),
        bytes=pattern.bytes_per_image, wait_ms=wait_ms_per_image, read_calls=read_calls, files_opened=files_opened)
