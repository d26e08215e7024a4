"""What a run costs the machine: CPU utilisation sampled in the background, and I/O counters.

The analysis asks "is the CPU saturated?" and "how many bytes and read calls per image?"; both
need figures taken during the run itself. `ResourceMonitor` samples CPU with psutil on a daemon
thread (cheap: one sample per `interval_s`) and reads `/proc/self/io` at start and stop.
`read_bytes` counts bytes fetched from storage (0 when the page cache served them); `rchar`
counts bytes handed to read calls, cached or not; `syscr` counts read calls.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from stallscope import cpu_limits
from stallscope.config import require_positive
from stallscope.cpu_limits import CpuLimits, Throttling

log = logging.getLogger(__name__)

PROC_IO = Path("/proc/self/io")
IO_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")


def minor_faults() -> int | None:
    """This process's minor page faults so far (every thread), or None where the OS keeps no count.
    Each is a page the kernel had to find and zero: an allocator that hands memory back and takes it
    again pays one per 4 KB it touches (see storage.heap_padding)."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# /proc/self/io's names (the run record's) for psutil's fields, which it reads from that file on Linux.
_PSUTIL_IO_FIELDS = {"rchar": "read_chars", "wchar": "write_chars", "syscr": "read_count", "syscw": "write_count",
                     "read_bytes": "read_bytes", "write_bytes": "write_bytes"}


def _this_process() -> psutil.Process:
    """psutil's handle on this process, made once per process (a forked child makes its own)."""
    if _PROCESS[0] is None or _PROCESS[0].pid != os.getpid():
        _PROCESS[0] = psutil.Process()
    return _PROCESS[0]


_PROCESS: list[psutil.Process | None] = [None]


def read_proc_io() -> dict[str, int] | None:
    """This process's I/O counters (/proc/self/io, through psutil), or None where the kernel does not
    offer them."""
    try:
        counters = _this_process().io_counters()
    except (psutil.Error, AttributeError, NotImplementedError, OSError):  # no io_counters on this platform
        return None
    return {name: int(getattr(counters, field)) for name, field in _PSUTIL_IO_FIELDS.items()
            if hasattr(counters, field)}


def io_delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    if before is None or after is None:
        return None
    return {name: after[name] - before[name] for name in IO_FIELDS if name in before and name in after}


@dataclasses.dataclass(frozen=True)
class CpuSample:
    elapsed_s: float
    process_percent: float  # this process, 100 = one core busy
    system_percent: float   # the CPU this process may use (cpu_limits), 100 = all of it busy, by anyone
    per_cpu_percent: tuple[float, ...]  # every CPU of the machine


@dataclasses.dataclass(frozen=True)
class ResourceReport:
    """CPU samples and I/O deltas of a run; `summary()` is what goes into summary.json."""

    interval_s: float
    duration_s: float
    samples: tuple[CpuSample, ...]
    io: dict[str, int] | None
    process_cpu_seconds: float
    limits: CpuLimits
    throttling: Throttling | None = None  # the quota's counters over the run; None without a quota

    @property
    def cores(self) -> float:
        """The CPU this process may use, in cores (its affinity, under its cgroup's quota)."""
        return self.limits.capacity

    def summary(self) -> dict[str, Any]:
        """The run's CPU figures. A run shorter than half a sampling interval has no sample: the
        machine's busy share is then unknown (None), and the process's own mean comes from its CPU
        time, which the kernel counts whatever the length."""
        process = [s.process_percent for s in self.samples]
        system = [s.system_percent for s in self.samples]
        if not self.samples:
            own = 100.0 * self.process_cpu_seconds / self.duration_s if self.duration_s > 0 else None
            process, system = ([own] if own is not None else []), []
        return {
            "cores": self.cores,
            "cpus": len(self.limits.cpus),
            "quota_cores": self.limits.quota_cores,
            "throttled_s": self.throttling.throttled_s if self.throttling else None,
            "throttled_share": self.throttling.throttled_share if self.throttling else None,
            "samples": len(self.samples),
            "process_mean_percent": _mean(process),
            "process_max_percent": max(process, default=None),
            "system_mean_percent": _mean(system),
            "system_max_percent": max(system, default=None),
            "process_cpu_seconds": self.process_cpu_seconds,
            "duration_s": self.duration_s,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "duration_s": self.duration_s,
            "cores": self.cores,
            "cpu": self.summary(),
            "io": self.io,
            "io_source": str(PROC_IO) if self.io is not None else None,
            "samples": [dataclasses.asdict(s) for s in self.samples],
        }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def share_busy(limits: CpuLimits, per_cpu_percent: tuple[float, ...], process_percent: float) -> float:
    """How busy the CPU this process may use was, 100 = all of it: this process's own use plus what
    other processes took of it (on its CPUs; under a quota, only once they left it fewer idle CPUs than
    the quota). Taskset or a container's cpuset leaves the other CPUs' load out; the machine-wide mean
    would read a container pinned to 2 busy cores of 64 idle ones as 3% busy."""
    busy = sum(per_cpu_percent[cpu] for cpu in limits.cpus if cpu < len(per_cpu_percent)) / 100.0
    own = process_percent / 100.0
    taken = min(limits.capacity, own + limits.busy_by_others(busy, own))
    return 100.0 * taken / limits.capacity if limits.capacity else 0.0


class ResourceMonitor:
    """Context manager: samples CPU every `interval_s` on a daemon thread; `report` after exit."""

    def __init__(self, interval_s: float = 0.25) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be above 0, got {interval_s!r}")
        self.interval_s = interval_s
        self.report: ResourceReport | None = None
        self._process = psutil.Process(os.getpid())
        self._limits = cpu_limits.current()
        self._samples: list[CpuSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ResourceMonitor":
        self._started = time.perf_counter()
        self._io_before = read_proc_io()
        self._cpu_before = self._cpu_seconds()
        self._throttling_before = cpu_limits.throttling(self._limits)
        # The first call only sets the reference point; later ones measure since the previous. System
        # CPU is computed from our own cpu_times deltas: psutil.cpu_percent keeps one reference point
        # per thread, so priming it here left the sampling thread's first sample at 0.0.
        self._process.cpu_percent(None)
        self._per_cpu_before = psutil.cpu_times(percpu=True)
        self._thread = threading.Thread(target=self._sample_loop, name="stallscope-resources", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        last = self._samples[-1].elapsed_s if self._samples else 0.0
        if time.perf_counter() - self._started - last >= self.interval_s / 2:
            self._take_sample()  # the tail since the last tick; a sliver of a tick is noise, not a figure
        self.report = ResourceReport(
            interval_s=self.interval_s,
            duration_s=time.perf_counter() - self._started,
            samples=tuple(self._samples),
            io=io_delta(self._io_before, read_proc_io()),
            process_cpu_seconds=self._cpu_seconds() - self._cpu_before,
            limits=self._limits,
            throttling=self._throttling_since_start(),
        )

    def _throttling_since_start(self) -> Throttling | None:
        now = cpu_limits.throttling(self._limits)
        return now.since(self._throttling_before) if now and self._throttling_before else None

    def _cpu_seconds(self) -> float:
        times = self._process.cpu_times()
        return times.user + times.system

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take_sample()

    def _take_sample(self) -> None:
        try:
            per_cpu_now = psutil.cpu_times(percpu=True)
            per_cpu = tuple(busy_percent(before, after) for before, after in zip(self._per_cpu_before, per_cpu_now))
            self._per_cpu_before = per_cpu_now
            process = self._process.cpu_percent(None)
            self._samples.append(CpuSample(
                elapsed_s=round(time.perf_counter() - self._started, 4),
                process_percent=process,
                system_percent=share_busy(self._limits, per_cpu, process),
                per_cpu_percent=per_cpu,
            ))
        except psutil.Error as exc:  # a sample lost is not worth failing a training run over
            log.debug("CPU sample failed: %s", exc)


def busy_percent(before: Any, after: Any) -> float:
    """Share of time one CPU was busy between two psutil `cpu_times` readings, as psutil counts it:
    everything but idle and iowait (guest time is already inside user and nice)."""
    deltas = {name: max(0.0, getattr(after, name) - getattr(before, name)) for name in after._fields}
    total = sum(value for name, value in deltas.items() if name not in ("guest", "guest_nice"))
    idle = deltas.get("idle", 0.0) + deltas.get("iowait", 0.0)
    return round(100.0 * (total - idle) / total, 1) if total > 0 else 0.0


def files_opened(source_kind: str, *, images: int, files_in_source: int, passes: float) -> int:
    """Files the pipeline opened, from the file list: one per image read from JPEG files, one per
    shard per pass over TFRecords (each shard is opened once per pass)."""
    require_positive("files_in_source", files_in_source)
    if source_kind == "files":
        return images
    return max(1, math.ceil(files_in_source * max(passes, 0.0) - 1e-9))


@dataclasses.dataclass(frozen=True)
class IoPerImage:
    """I/O figures of one pass of a pipeline, per image it produced.

    From the `/proc/self/io` deltas (`read_proc_io`): bytes_read is `rchar` (everything read,
    cached or not), storage_bytes is `read_bytes` (what really came from the device: ~0 with a warm
    cache, which is the evidence for or against a fetch stall), read_calls is `syscr`.
    files_opened comes from the source's file list (the kernel keeps no count of opens).
    """

    images: int
    bytes_read: float
    storage_bytes: float
    read_calls: float
    files_opened: float

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def per_image(io: dict[str, int] | None, images: int, *, source_kind: str, files_in_source: int,
              examples: int) -> IoPerImage | None:
    """Divides an I/O counter delta over the images produced; None when no counters or no images."""
    if io is None or images <= 0:
        return None
    passes = images / examples if examples > 0 else 0.0
    opened = files_opened(source_kind, images=images, files_in_source=max(1, files_in_source), passes=passes)
    return IoPerImage(
        images=images,
        bytes_read=io.get("rchar", 0) / images,
        storage_bytes=io.get("read_bytes", 0) / images,
        read_calls=io.get("syscr", 0) / images,
        files_opened=opened / images,
    )
