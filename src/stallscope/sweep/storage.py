"""The storage axis of a sweep: where one run reads its data from.

`local` reads the folder on local disk. A latency ('10ms') serves the same folder through the
storage emulator (`stallscope.storage.emulator.emulate`) for the duration of one run, so every run
starts on a fresh store with fresh connections; the run reads `store.url` with `store.env` added
to its environment, and what the store served (requests, connections, bytes) is kept beside the run.
This is the only place the sweep touches storage. Without the emulator (an installation that lacks
`stallscope.storage`) a latency other than local is refused in one line before anything runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from stallscope.errors import UsageError
from stallscope.sweep.grid import LOCAL, latency_seconds

log = logging.getLogger(__name__)

EMULATOR_MODULE = "stallscope.storage.emulator"
STORE_KINDS = ("gcs", "s3", "mount")


@dataclasses.dataclass(frozen=True)
class CellData:
    """What a run is pointed at: a path or URL for --dataset-path, the environment that reaches it,
    a few words on where it lives for the report, and (emulated stores only) a call that returns what
    the store has served so far, as a dict of counters (requests, connections, bytes, ...)."""

    path: str
    env: dict[str, str]
    where: str
    counters: Callable[[], dict[str, int]] | None = None


def _emulate():
    """The emulator's `emulate` context manager, or None where this installation has none."""
    try:
        module = importlib.import_module(EMULATOR_MODULE)
    except ImportError as exc:
        log.info("storage emulator unavailable: %s", exc)
        return None
    return getattr(module, "emulate", None)


def require_emulator(latencies: tuple[str, ...], store: str = "gcs") -> None:
    """Refuses, before anything runs, a remote latency the installation or the machine cannot emulate."""
    remote = [latency for latency in latencies if latency != LOCAL]
    if not remote:
        return
    if _emulate() is None:
        raise UsageError(f"--latency: {remote[0]} needs the storage emulator ({EMULATOR_MODULE}), which this "
                         f"installation lacks; expected 'local', got {','.join(latencies)}")
    if store == "mount":
        from stallscope.storage.emulator.fuse_mount import why_no_fuse

        why = why_no_fuse()
        if why:
            raise UsageError(f"--store: mount needs FUSE on this machine, got {why}; expected --store gcs or s3")


@contextlib.contextmanager
def cell_data(local_path: Path, latency: str, *, store: str = "gcs", bandwidth_bps: float | None = None,
              max_duration_s: float | None = None) -> Iterator[CellData]:
    """The data of one run: `local_path` itself, or an emulated store serving it at `latency` (read-only),
    stopped when the run is over; it ends itself after `max_duration_s` or when this process dies."""
    if latency == LOCAL:
        yield CellData(path=str(local_path), env={}, where="local disk")
        return
    emulate = _emulate()
    if emulate is None:
        require_emulator((latency,), store)
    options: dict = {"latency_s": latency_seconds(latency), "bandwidth_bps": bandwidth_bps}
    if max_duration_s:
        options["max_duration_s"] = max_duration_s
    with contextlib.ExitStack() as stack:
        if store == "mount":
            options["mount_point"] = stack.enter_context(tempfile.TemporaryDirectory(prefix="stallscope-sweep-mount-"))
        served = stack.enter_context(emulate(local_path, store, **options))
        cap = f", {bandwidth_bps / 1e6:g} Mbit/s" if bandwidth_bps else ""
        yield CellData(path=str(served.url), env={str(k): str(v) for k, v in dict(served.env).items()},
                       where=f"emulated {store} store, {latency} per request{cap}",
                       counters=lambda: dict(served.counters().to_dict()))
