"""A conversion worker ends with the process that started it, however that one ends.

A pool's worker waits on a pipe whose writing end its siblings also hold, so it never sees the end of
its parent: killed parents left workers asleep for good, holding the output's files. The kernel is
asked to SIGKILL the worker when its parent ends (Linux: PR_SET_PDEATHSIG), and a worker whose parent
ended before it asked exits at once. Stopping the workers in an orderly way (Ctrl-C, SIGTERM) is the
parent's job: a worker ignores SIGINT, which the terminal sends the whole process group, and takes
SIGTERM as the kernel's default, not as the parent's handler that it inherited by fork.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent_pid: int) -> None:
    """In a worker, first thing: SIGKILL from the kernel when the parent ends; an exit now if it has."""
    prctl = _prctl()
    if prctl is not None and prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        import ctypes

        log.warning("could not ask to end with the parent process: %s", os.strerror(ctypes.get_errno()))
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent is gone already (this process was re-parented): nothing to do for it


def stopped_by_parent() -> None:
    """In a worker: Ctrl-C and SIGTERM are the parent's to act on (it stops the workers by PID)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
