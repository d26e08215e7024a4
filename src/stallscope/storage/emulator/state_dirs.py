"""The emulator's state folders in the temporary folder (a ready file, the server's log), and clearing
those a killed run left behind.

`kill -9` gives no process a chance to clean up, so each folder records who made it (PID and that
process's start time, so a reused PID is not taken for it) in a marker file; every new store removes
the folders whose maker is gone. Only folders with that marker are touched: nothing else in the
temporary folder, even with the same prefix, is stallscope's to delete.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from stallscope.lifetime import start_time, still_running

log = logging.getLogger(__name__)

PREFIX = "stallscope-storage-"
MARKER = "made-by.json"


def new_state_dir() -> Path:
    """A fresh state folder, marked with this process as its maker; dead runs' folders are cleared first."""
    clear_dead_state_dirs()
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))
    (folder / MARKER).write_text(json.dumps({"pid": os.getpid(), "started": start_time(os.getpid())}))
    return folder


def _maker_gone(folder: Path) -> bool:
    """The folder's marker names a process that no longer runs (or whose PID another process now has)."""
    try:
        made = json.loads((folder / MARKER).read_text())
        pid, started = int(made["pid"]), made.get("started")
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no marker of ours: not ours to judge
    return not still_running(pid, started)


def clear_dead_state_dirs(root: Path | None = None) -> list[Path]:
    """Removes the marked state folders in `root` (the temporary folder) whose maker is gone; returns them."""
    root = Path(root or tempfile.gettempdir())
    cleared = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return cleared
    for folder in candidates:
        if _maker_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            cleared.append(folder)
            log.info("removed %s, left by a storage emulator that was killed", folder)
    return cleared
