"""The storage axis of a sweep: where one run reads its data from.

`local` reads the folder on local disk. A latency ('10ms') serves the same folder through the
storage emulator (`stallscope.storage.emulator.emulate`) for the duration of one run, so every run
starts on a fresh store with fresh connections; the run reads `store.url` with `store.env` added
to its environment. This is the only place the sweep touches storage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
from collections.abc import Iterator
from pathlib import Path

from stallscope.errors import UsageError
from stallscope.sweep.grid import LOCAL, latency_seconds

log = logging.getLogger(__name__)

EMULATOR_MODULE = "stallscope.storage.emulator"
STORE_KINDS = ("gcs", "s3", "mount")


@dataclasses.dataclass(frozen=True)
class CellData:
    """What a run is pointed at: a path or URL for --dataset-path, the environment that reaches it,
    and a few words on where it lives for the report."""

    path: str
    env: dict[str, str]
    where: str


def _emulate():
    """The emulator's `emulate` context manager, or None where this installation has none."""
    try:
        module = importlib.import_module(EMULATOR_MODULE)
    except ImportError as exc:
        log.info("storage emulator unavailable: %s", exc)
        return None
    return getattr(module, "emulate", None)


def require_emulator(latencies: tuple[str, ...]) -> None:
    """Refuses, before anything runs, a remote latency the installation cannot emulate."""
    remote = [latency for latency in latencies if latency != LOCAL]
    if remote and _emulate() is None:
        raise UsageError(f"--latency: {remote[0]} needs the storage emulator ({EMULATOR_MODULE}), which this "
                         f"installation lacks; expected 'local', got {','.join(latencies)}")


@contextlib.contextmanager
def cell_data(local_path: Path, latency: str, *, store: str = "gcs",
              bandwidth_bps: float | None = None) -> Iterator[CellData]:
    """The data of one run: `local_path` itself, or an emulated store serving it at `latency`."""
    if latency == LOCAL:
        yield CellData(path=str(local_path), env={}, where="local disk")
        return
    emulate = _emulate()
    if emulate is None:
        require_emulator((latency,))
    with emulate(local_path, store, latency_seconds(latency), bandwidth_bps) as served:
        cap = f", {bandwidth_bps / 1e6:g} Mbit/s" if bandwidth_bps else ""
        yield CellData(path=str(served.url), env={str(k): str(v) for k, v in dict(served.env).items()},
                       where=f"emulated {store} store, {latency} per request{cap}")
