"""A check run on a daemon thread every `interval_s` until it first finds something, for the watches
that end a run a C++ call will not return from: `storage.stuck_calls` (a file call on a network file
system) and `service.watchdog` (the tf.data service's batches). The thread cannot stop the stuck call;
what the check finds goes to a handler that ends the process."""

from __future__ import annotations

import abc
import threading


class Watchdog(abc.ABC):
    """Runs `check()` every `interval_s` (by default a quarter of `timeout_s`, at most 1 s) from
    `start()` until it returns True (it found something and handed it on) or `stop()`."""

    thread_name = "stallscope-watch"

    def __init__(self, timeout_s: float, interval_s: float | None = None) -> None:
        self.timeout_s = timeout_s
        self.interval_s = interval_s if interval_s is not None else min(1.0, timeout_s / 4)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def can_watch(self) -> bool:
        """Whether this machine lets the check see what it looks for (else start() starts nothing)."""
        return True

    @abc.abstractmethod
    def check(self) -> bool:
        """Each watch's own look: True once it found something and handed it on (the watch then ends)."""

    def start(self):
        if self.can_watch():
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.check():
                return
