"""Ending a run that the tf.data service has stopped sending batches to.

TF's `tf.data.experimental.service.distribute` has no timeout: with no worker registered, or with
the dispatcher or its workers gone mid-run, `next(iterator)` waits in C++ for ever, deaf to Ctrl-C.
`ServiceWatch` times each wait for a batch (the caller marks it with `waiting()`); one that lasts the
whole timeout goes to `on_silent(message)`, which must end the process, since the waiting thread
cannot be stopped (as `storage.stuck_calls` does for a network file system that stops answering).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from stallscope.storage.stuck_calls import end_process
from stallscope.watchdog import Watchdog

DEFAULT_TIMEOUT_S = 30.0


def silence_message(target: str, timeout_s: float, flag: str = "--data-service",
                    timeout_flag: str = "--data-service-timeout") -> str:
    return (f"{flag}: the tf.data service at {target} sent no batch for {timeout_s:g} s (no worker registered, "
            f"or the dispatcher or its workers stopped?); expected batches within {timeout_flag}")


class ServiceWatch(Watchdog):
    """Watches the waits for batches from the service at `target` on a daemon thread; a wait longer
    than `timeout_s` goes to `on_silent` once (by default: the line, then exit code 2)."""

    thread_name = "stallscope-data-service-watch"

    def __init__(self, target: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_silent: Callable[[str], None] = end_process, *, interval_s: float | None = None) -> None:
        super().__init__(timeout_s, interval_s)
        self.target = target
        self.on_silent = on_silent
        self._since: float | None = None  # when the current wait began; None between waits

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a call that waits for the service (making an iterator, `next(iterator)`)."""
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def check(self) -> bool:
        since = self._since
        if since is not None and time.monotonic() - since >= self.timeout_s:
            self.on_silent(silence_message(self.target, self.timeout_s))
            return True
        return False
