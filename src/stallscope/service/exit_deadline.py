"""Ending this process at a deadline even while a TensorFlow call holds Python's GIL.

TF 2.21's `WorkerServer.stop()` calls into C++ without releasing the GIL, and there it waits for each
task's prefetch thread; a task reading a dynamically sharded dataset asks the dispatcher for its next
split and retries a dispatcher that is gone for `WorkerConfig.dispatcher_timeout_ms` (an hour). While
it waits, no Python thread runs: not a signal handler, not a timer thread, not `os._exit`. So the
deadline here is the C library's: a POSIX timer (`timer_create` with SIGEV_THREAD) whose expiry starts
a thread of its own that calls `_exit(code)`, with its one line written to stderr `MESSAGE_LEAD_S` before by a
second timer (`system("printf ...")`), both without the GIL. Off Linux, or where the timer cannot be made, a
Python thread does the same (it fires only when the GIL is free).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shlex
import sys
import threading

log = logging.getLogger(__name__)

_CLOCK_MONOTONIC = 1
_SIGEV_THREAD = 2
# The line goes out at the deadline and the exit this long after, so that the shell printing it has run.
MESSAGE_LEAD_S = 1.0


class _SigEvent(ctypes.Structure):
    """glibc's `struct sigevent` (64 bytes) with the SIGEV_THREAD members."""

    _fields_ = [("sigev_value", ctypes.c_void_p), ("sigev_signo", ctypes.c_int), ("sigev_notify", ctypes.c_int),
                ("sigev_notify_function", ctypes.c_void_p), ("sigev_notify_attributes", ctypes.c_void_p),
                ("_pad", ctypes.c_byte * 32)]


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _TimeSpec), ("it_value", _TimeSpec)]


@functools.cache
def _libc():
    """The C library with timer_create (glibc >= 2.34 has it in libc itself); None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    for name in (None, "librt.so.1"):
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            lib.timer_create, lib.timer_settime, lib.timer_delete, lib._exit, lib.system  # noqa: B018
        except (OSError, AttributeError):
            continue
        lib.timer_create.argtypes = [ctypes.c_int, ctypes.POINTER(_SigEvent), ctypes.POINTER(ctypes.c_void_p)]
        lib.timer_settime.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_ITimerSpec), ctypes.c_void_p]
        lib.timer_delete.argtypes = [ctypes.c_void_p]
        return lib
    return None


class ExitDeadline:
    """Armed on construction: after `seconds`, `message` on stderr, and the process ends with
    `exit_code` (`MESSAGE_LEAD_S` later), whatever holds the GIL then. `cancel()` disarms it."""

    def __init__(self, seconds: float, exit_code: int, message: str) -> None:
        self.seconds, self.exit_code, self.message = seconds, exit_code, message
        self._timers: list[ctypes.c_void_p] = []
        self._cancelled = threading.Event()
        # Kept alive as long as the timers: the C library reads them when they fire.
        self._command = ctypes.create_string_buffer(
            f"printf '%s\\n' {shlex.quote(message)} >&2".encode())
        libc = _libc()
        if libc is None or not self._arm_native(libc):
            threading.Thread(target=self._python_fallback, name="stallscope-exit-deadline", daemon=True).start()

    def _arm_native(self, libc) -> bool:
        for function, argument, after_s in ((libc.system, ctypes.addressof(self._command), self.seconds),
                                            (libc._exit, self.exit_code, self.seconds + MESSAGE_LEAD_S)):
            event = _SigEvent(sigev_value=argument, sigev_notify=_SIGEV_THREAD,
                              sigev_notify_function=ctypes.cast(function, ctypes.c_void_p).value)
            timer = ctypes.c_void_p()
            whole = int(after_s)
            when = _ITimerSpec(it_value=_TimeSpec(whole, int((after_s - whole) * 1e9)))
            if (libc.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0
                    or libc.timer_settime(timer, 0, ctypes.byref(when), None) != 0):
                log.info("no native timer (%s): the deadline needs the GIL", os.strerror(ctypes.get_errno()))
                self._delete_timers(libc)
                return False
            self._timers.append(timer)
        return True

    def _python_fallback(self) -> None:
        if not self._cancelled.wait(self.seconds):
            sys.stdout.flush()
            print(self.message, file=sys.stderr, flush=True)
            os._exit(self.exit_code)

    def _delete_timers(self, libc) -> None:
        for timer in self._timers:
            libc.timer_delete(timer)
        self._timers.clear()

    def cancel(self) -> None:
        self._cancelled.set()
        libc = _libc()
        if libc is not None:
            self._delete_timers(libc)
