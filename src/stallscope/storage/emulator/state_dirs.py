"""The emulator's state folders in the temporary folder (a ready file, the server's log), and clearing
those a killed run left behind.

`kill -9` gives no process a chance to clean up, so each folder records who made it (PID and that
process's start time, so a reused PID is not taken for it) in a marker file; every new store removes
the folders whose maker is gone. Only folders with that marker are touched: nothing else in the
temporary folder, even with the same prefix, is stallscope's to delete.
"""

from __future__ import annotations

from pathlib import Path

from stallscope.lifetime import MARKER, clear_dead_marked_folders, marked_folder

__all__ = ["MARKER", "PREFIX", "clear_dead_state_dirs", "new_state_dir"]

PREFIX = "stallscope-storage-"


def new_state_dir() -> Path:
    """A fresh state folder, marked with this process as its maker; dead runs' folders are cleared first."""
    clear_dead_state_dirs()
    return marked_folder(PREFIX)


def clear_dead_state_dirs(root: Path | None = None) -> list[Path]:
    """Removes the marked state folders in `root` (the temporary folder) whose maker is gone; returns them."""
    return clear_dead_marked_folders(PREFIX, "a storage emulator", root)
