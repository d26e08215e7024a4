"""TensorFlow's autograph files in a folder the process owns, removed when it ends.

Autograph writes every function it converts as `__autograph_generated_file*.py` into the temporary
folder and deletes them in an exit handler, which a killed process never runs: a trial of killed runs
left over a hundred. In stallscope's own processes they go into `$TMPDIR/stallscope-autograph-PID-*/`
instead, removed at exit (Ctrl-C and SIGTERM end through the exit handlers too). Nothing else changes:
the process's other temporary files, and those of its child processes, stay where they were.

`kill -9` runs no handler, so each folder records its maker (PID and start time, so a reused PID is not
taken for it) in a marker file, and the next stallscope process that makes its own folder removes
the folders whose maker is gone. Only folders with that marker are touched.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path

from stallscope.lifetime import clear_dead_marked_folders, marked_folder

log = logging.getLogger(__name__)

PREFIX = "stallscope-autograph-"
GENERATED_PREFIX = "__autograph_generated_file"  # the name autograph gives its files

_folder: Path | None = None


class _TempfileInto:
    """Stands in for the `tempfile` module in autograph's loader: its temporary files go into `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def NamedTemporaryFile(self, *args, **kwargs):  # noqa: N802 (the module function's name)
        kwargs.setdefault("dir", str(self.folder))
        return tempfile.NamedTemporaryFile(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(tempfile, name)


def own_autograph_folder() -> Path | None:
    """Points autograph (TensorFlow imported already) at a fresh folder of this process's; the same
    folder when asked again. None where TF's loader is not the one this knows (left as it is)."""
    global _folder
    if _folder is not None:
        return _folder
    try:
        from tensorflow.python.autograph.pyct import loader
    except ImportError:
        return None
    if getattr(loader, "tempfile", None) is not tempfile:
        log.info("autograph's loader does not write through tempfile here; its files stay where TF puts them")
        return None
    clear_dead_folders()
    pid = os.getpid()
    folder = marked_folder(f"{PREFIX}{pid}-")

    def remove() -> None:
        if os.getpid() == pid:  # not in a forked child that exits through the handlers
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)
    loader.tempfile = _TempfileInto(folder)
    _folder = folder
    return folder


def clear_dead_folders(root: Path | None = None) -> list[Path]:
    """Removes the marked autograph folders in `root` (the temporary folder) whose maker is gone."""
    return clear_dead_marked_folders(PREFIX, "a stallscope process", root)
