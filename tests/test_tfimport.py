"""TensorFlow's import: the collector forgets what it left only in stallscope's own processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LIMIT_S = 120
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _freeze_count(code: str) -> int:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=LIMIT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


@pytest.mark.timeout(LIMIT_S)
def test_the_python_api_leaves_the_users_collector_alone_and_the_command_line_freezes_tfs_import():
    """Frozen in a user's program, every object it held at that moment (a model it drops later) would be
    out of the collector's sight for good; in stallscope's own process the import's objects are, which
    saves about 1 s of CPU at its exit."""
    api = _freeze_count("import gc; from stallscope.tfimport import import_tensorflow; import_tensorflow(); "
                        "print(gc.get_freeze_count())")
    assert api == 0
    cli = _freeze_count("import gc; from stallscope.tfimport import freeze_collector_after_import, import_tensorflow; "
                        "freeze_collector_after_import(); import_tensorflow(); print(gc.get_freeze_count())")
    assert cli > 10_000
