"""How a conversion worker takes signals: its parent stops it.

A worker ends with the process that started it however that one ends (`stallscope.lifetime`:
SIGKILL from the kernel, nothing to save). Stopping the workers in an orderly way (Ctrl-C, SIGTERM)
is the parent's job: a worker ignores SIGINT, which the terminal sends the whole process group, and
takes SIGTERM as the kernel's default, not as the parent's handler that it inherited by fork.
"""

from __future__ import annotations

import signal


def stopped_by_parent() -> None:
    """In a worker: Ctrl-C and SIGTERM are the parent's to act on (it stops the workers by PID)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
