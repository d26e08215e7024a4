"""Whose the wait is: this process's CPU work, other processes' load, or reads from a remote store.

A run can wait for input for three reasons that look alike in a step's timing and call for opposite
fixes. Its own CPU work (decoding on cores it keeps busy) wants less work per image; other processes
filling the cores leave it nothing to fix in the pipeline; reads from a store with a latency per
request (the iterator waits on requests, the process almost idle) want more reads in flight, which
cost threads, not cores. Telling them apart takes the process's own CPU over the steps (resources.json)
beside the machine's, and the store under the data set's path (summary.json's source.storage).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from stallscope.analysis.cpu_window import CpuWindow
from stallscope.verdict import fmt_share

OWN_SHARE_OF_BUSY = 0.5     # this process kept at least half of the busy CPU: its work is what fills the cores
IDLE_WHILE_WAITING = 0.5    # process cores under half the input share: most of the wait is not its CPU work
FETCH_EXPLAINS = 0.5        # the requests' time per step covers at least half the wait per step


def own_share_of_busy(window: CpuWindow | None) -> float | None:
    """This process's share of the CPU that was busy over the steps (0..1); None where not sampled."""
    if window is None or window.process_cores is None or not window.cores or window.mean_percent <= 0:
        return None
    busy = window.cores * window.mean_percent / 100.0
    return min(1.0, window.process_cores / busy)


def others_fill_the_cores(window: CpuWindow | None) -> bool:
    """The cores were busy, but mostly with other processes' work: this one's is not what fills them."""
    share = own_share_of_busy(window)
    return share is not None and share < OWN_SHARE_OF_BUSY


def others_text(window: CpuWindow) -> str:
    """'other processes kept the cores busy: this process used 0.1 of 2 cores over the steps'."""
    cores = f" of {window.cores:g}" if window.cores else ""
    return (f"other processes kept the cores busy: this process used {window.process_cores:.1f}{cores} cores over "
            f"the steps, so its own work is not what fills them")


@dataclasses.dataclass(frozen=True)
class FetchWait:
    """A run whose input wait is reads from a remote store: the iterator waits on requests while the
    process is nearly idle. request_ms: the store's median per request (None where not timed)."""

    store: str                       # the data set's path: gs://data/train
    store_label: str                 # "gs:// bucket"
    wait_ms: float                   # input wait per step (the headline's)
    process_cores: float
    input_share: float
    request_ms: float | None = None
    requests_per_step: float | None = None
    stage: str | None = None         # the stage the reads run in, where the profiled window shows it
    source_kind: str | None = None   # summary.json's source kind: "files" (one request per image) or "records"

    @property
    def fetch_ms_per_step(self) -> float | None:
        """The requests' time per step, one at a time: what a sequential reader waits."""
        if self.request_ms is None or self.requests_per_step is None:
            return None
        return self.request_ms * self.requests_per_step

    def text(self) -> str:
        """'fetch: 20.1 ms per request on gs://data (gs:// bucket), 8 requests per step, ...'."""
        per = f"{self.request_ms:.1f} ms per request" if self.request_ms is not None else "latency per request not timed"
        line = f"fetch: {per} on {self.store} ({self.store_label})"
        if self.requests_per_step is not None:
            line += f", {self.requests_per_step:.3g} requests per step"
        line += (f"; the process used {self.process_cores:.2f} cores while {fmt_share(self.input_share)} of the step "
                 f"waited for input: the wait is the store's latency, not CPU work")
        return line


def fetch_wait(summary: dict[str, Any] | None, window: CpuWindow | None, *, input_share: float | None,
               wait_ms: float | None, batch_size: int | None, stage: str | None) -> FetchWait | None:
    """A FetchWait where the run waits for input (`input_share` from the headline), its data set is on a
    remote store, the process's own CPU over the steps is well under the wait (it was not computing), and,
    where the store timed its requests, the requests' time one after another explains the wait."""
    if input_share is None or wait_ms is None or window is None or window.process_cores is None:
        return None
    source = (summary or {}).get("source") if isinstance(summary, dict) else None
    storage = source.get("storage") if isinstance(source, dict) else None
    if not isinstance(storage, dict) or storage.get("kind") in (None, "local"):
        return None
    if window.process_cores >= IDLE_WHILE_WAITING * input_share:
        return None
    latency = summary.get("store_latency") if isinstance(summary, dict) else None
    request_ms = _positive((latency or {}).get("p50_ms")) if isinstance(latency, dict) else None
    fetched = summary.get("fetched") if isinstance(summary, dict) else None
    per_image = _positive((fetched or {}).get("requests_per_image")) if isinstance(fetched, dict) else None
    per_step = per_image * batch_size if per_image is not None and batch_size else None
    found = FetchWait(store=str(source.get("path") or summary.get("dataset_path") or "the store"),
                      store_label=str(storage.get("label") or storage.get("kind")), wait_ms=wait_ms,
                      process_cores=window.process_cores, input_share=input_share, request_ms=request_ms,
                      requests_per_step=per_step, stage=stage,
                      source_kind=source.get("kind") if isinstance(source.get("kind"), str) else None)
    fetching = found.fetch_ms_per_step
    if fetching is not None and fetching < FETCH_EXPLAINS * wait_ms:
        return None  # the requests, even one at a time, leave most of the wait unexplained
    return found


def reads_in_flight(fetch: FetchWait, device_images_per_second: float | None, batch_size: int | None) -> int | None:
    """Latency x throughput: the requests in flight that keep the device fed (None where not timed)."""
    if fetch.request_ms is None or fetch.requests_per_step is None or not batch_size:
        return None
    if device_images_per_second is None or not math.isfinite(device_images_per_second):
        return None
    per_image = fetch.requests_per_step / batch_size
    return max(2, math.ceil(device_images_per_second * per_image * fetch.request_ms / 1000.0))


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None
