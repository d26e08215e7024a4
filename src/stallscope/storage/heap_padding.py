"""Keeping freed memory at the top of glibc's heaps, for a process that streams records through Python.

glibc's malloc hands the free memory at the top of a heap back to the kernel once more than a
threshold of it is free there, and the next allocation that reaches it takes fresh pages, each a
minor page fault that the kernel zeroes. The s3:// record reader (`tfdata_readers.py`) frees a 16 MB block,
a group tensor and its unbatched copies for every 200-odd records, and that churn trims the heaps so
often that the JPEG decoder's output buffers land on fresh pages too: 49-73 minor faults per image
in `stallscope train`'s measured steps against 20-28 with a top pad and 18-25 from local disk, and
2.0-2.3 ms of CPU per image against 1.6-2.0 (tuned pipeline, ImageNet-like records through the
emulated store at 10 ms, 2 cores). `M_TOP_PAD` keeps
TOP_PAD_BYTES free at each heap's top when it trims (and grows a heap by that much more). Whole
`stallscope train` runs of that kind (`/usr/bin/time -v`, 240 steps): 552-611 thousand minor faults
and 1,184-1,212 images/s unpadded; 346-353 thousand and 1,292-1,355 at 16 MB; 260-271 thousand and
1,356-1,361 at 32 MB; 258-274 thousand and 1,360-1,382 at 64 MB. Peak resident memory grows with the
pad (0.88-0.96 GB unpadded; 1.0, 1.11 and 1.20 GB), so it is 32 MB: as few faults as 64, for about
0.2 GB.

It is a process-wide setting, so it is made once, only where it was measured to matter (a pipeline
that streams s3:// records in this process), only with glibc, and never over a user's own choice:
any MALLOC_TOP_PAD_, MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ in the environment, or
STALLSCOPE_HEAP_PADDING=0, leaves malloc as it is. Made when the pipeline is built, after
TensorFlow's start-up has moved malloc's own thresholds, it saves about half the faults it saves
when made before TensorFlow loads. The CLI makes it early (`cli.flags.apply_storage_flags`); a program
of the user's that builds such a pipeline gets it late, unless it calls `pad_heaps()` first.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

log = logging.getLogger(__name__)

TOP_PAD_BYTES = 32 << 20
M_TOP_PAD = -2  # glibc's malloc.h
SWITCH_ENV = "STALLSCOPE_HEAP_PADDING"
USER_SETTINGS = ("MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")

_lock = threading.Lock()
_state: dict[str, str] = {}


def pad_heaps() -> str:
    """Sets M_TOP_PAD to TOP_PAD_BYTES once per process where it may; returns what malloc does, for
    the run's description of its reader: "32 MB kept free per heap", or why it is left as it is."""
    with _lock:
        if "said" not in _state:
            _state["said"] = _apply()
        return _state["said"]


def _apply() -> str:
    if os.environ.get(SWITCH_ENV, "").strip() == "0":
        return f"malloc as configured ({SWITCH_ENV}=0)"
    chosen = [name for name in USER_SETTINGS if os.environ.get(name)]
    if chosen:
        return f"malloc as configured ({chosen[0]})"
    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "malloc as it is (not glibc)"
    version.restype = ctypes.c_char_p
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if mallopt(M_TOP_PAD, TOP_PAD_BYTES) != 1:
        log.debug("mallopt(M_TOP_PAD) refused by glibc %s", version().decode())
        return "malloc as it is (mallopt refused)"
    log.info("malloc keeps %d MB free at the top of each heap (s3:// records stream through Python); "
             "%s=0 turns this off", TOP_PAD_BYTES >> 20, SWITCH_ENV)
    return f"{TOP_PAD_BYTES >> 20} MB kept free per heap"
