"""Importing TensorFlow without its start-up banner.

TF 2.21 prints oneDNN and CPU-feature notices straight to file descriptor 2 before its own log
level applies, so `TF_CPP_MIN_LOG_LEVEL` alone cannot hide them. Python caches modules, so doing
the first import here keeps every later `import tensorflow` quiet too.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import sys

from stallscope.extras import needs_extra


@contextlib.contextmanager
def stderr_fd_silenced():
    """Hides what C++ code writes straight to file descriptor 2 (Python's sys.stderr too) meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@functools.cache  # one exit handler, however often it is asked for
def silence_cpp_stderr_at_exit() -> None:
    """From the exit handlers on, what C++ code writes to file descriptor 2 is dropped: TF's threads
    log their own shutdown as the process ends (after failed decodes: "Local rendezvous is aborting
    with status: ABORTED: Shutdown"). Python has printed everything of ours, tracebacks included, by
    the time exit handlers run."""

    def silence() -> None:
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    atexit.register(silence)


def import_tensorflow():
    """Returns the tensorflow module, imported with its C++ start-up notices hidden; where it is not
    installed (the core leaves it to the environment), the one line naming the `cpu` extra."""
    if "tensorflow" in sys.modules:
        if _OWN_AUTOGRAPH_FOLDER:  # imported by a plain `import tensorflow` first
            _own_autograph_folder()
        return sys.modules["tensorflow"]
    with stderr_fd_silenced():
        with needs_extra("cpu", "this command"):
            import tensorflow
        # Keras and the first device query print more notices; trigger them here too.
        tensorflow.config.list_physical_devices()
    if _FREEZE_AFTER_IMPORT:
        _freeze_collector()
    if _OWN_AUTOGRAPH_FOLDER:
        _own_autograph_folder()
    return tensorflow


_FREEZE_AFTER_IMPORT = False
_OWN_AUTOGRAPH_FOLDER = False


def own_autograph_folder_after_import() -> None:
    """For a process that is stallscope's own (the command line): autograph's generated files go into a
    folder the process owns and removes at exit (autograph_folder.py), not loose into the temporary
    folder, where a killed run left them. Not in a program of the user's (the Python API)."""
    global _OWN_AUTOGRAPH_FOLDER
    _OWN_AUTOGRAPH_FOLDER = True
    if "tensorflow" in sys.modules:
        _own_autograph_folder()


def _own_autograph_folder() -> None:
    from stallscope.autograph_folder import own_autograph_folder

    own_autograph_folder()


def freeze_collector_after_import() -> None:
    """For a process that is stallscope's own (the command line): TF's import leaves a few hundred
    thousand objects that live as long as the process, and the cyclic collector walked them all in each
    full collection and once more at exit (about 1 s of CPU at the end of every process that imported TF).
    Collected once after the import, then kept out of its sight; what the process makes later is collected
    as before. Not in a program of the user's (the Python API): freezing there would keep every object
    the program holds at that moment out of the collector's sight for good, a model dropped later too."""
    global _FREEZE_AFTER_IMPORT
    _FREEZE_AFTER_IMPORT = True
    if "tensorflow" in sys.modules:
        _freeze_collector()


def _freeze_collector() -> None:
    gc.collect()
    gc.freeze()
