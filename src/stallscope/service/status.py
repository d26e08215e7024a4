"""A status line for a running dispatcher or worker, printed every so often by `stallscope serve`.

What TF 2.21 lets a server see of itself cheaply: a dispatcher its registered workers, a worker its
tasks (one per job it serves). A registered worker stays registered after its process is gone, so the
dispatcher's line also says how many of them answer a handshake now (workers.py). Elements and bytes
served are counted inside TF's C++ and not exposed to Python; this process's CPU is (psutil), and it
is what sizes the service: a worker near its cores is the limit, one well below them waits on the
trainer or the link.
"""

from __future__ import annotations

import time

import psutil

from stallscope.service import workers


class StatusMeter:
    """This process's CPU since the last line, and the server's counts, as one line."""

    def __init__(self, server, role: str) -> None:
        self.server, self.role = server, role
        self._process = psutil.Process()
        self._cpu, self._at = self._cpu_seconds(), time.monotonic()

    def _cpu_seconds(self) -> float:
        times = self._process.cpu_times()
        return times.user + times.system

    def line(self) -> str:
        cpu, now = self._cpu_seconds(), time.monotonic()
        cores = (cpu - self._cpu) / max(now - self._at, 1e-9)
        self._cpu, self._at = cpu, now
        if self.role == "dispatcher":
            count = self.server.num_workers()
            counted = f"{count} worker(s) registered" if count is not None else "workers: not said by TF"
            counted += f", {self._answering()}"
        else:
            count = self.server.num_tasks()
            counted = f"{count} task(s)" if count is not None else "tasks: not said by TF"
        return (f"{self.role} at {self.server.target}: {counted}, CPU {cores:.2f} core(s) since the last line "
                "(elements and bytes served: not exposed by TF)")

    def _answering(self) -> str:
        addresses = workers.registered_addresses(f"127.0.0.1:{self.server.port}")
        if addresses is None:
            return "answering: the dispatcher did not say who registered"
        return f"{len(workers.answering(addresses))} answering"
