"""SIGTERM as Ctrl-C, for commands whose clean-up runs on KeyboardInterrupt."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler, `kill`) raises KeyboardInterrupt in the main thread for the block, so a
    command stopped either way takes the same path: its clean-up, one line, exit 130. Elsewhere than
    the main thread (a caller's thread running `main`), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
