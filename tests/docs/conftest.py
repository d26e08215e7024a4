"""Fixtures of the docs tests: a reader's folder with the tiny data set of Getting started."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from docs_blocks import DATA_COMMAND, REPO, run_stallscope  # noqa: E402


@pytest.fixture(scope="session")
def docs_data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("docs-data")
    with contextlib.chdir(folder):
        code, out, err = run_stallscope(shlex.split(DATA_COMMAND)[1:])
    assert code == 0, out + err
    return folder / "data"


@pytest.fixture
def page_folder(docs_data, tmp_path, monkeypatch) -> Path:
    """A reader's folder: the data set of Getting started, the repository's examples, stallscope on PATH."""
    folder = tmp_path / "reader"
    folder.mkdir()
    shutil.copytree(docs_data, folder / "data")
    (folder / "examples").symlink_to(REPO / "examples")
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    return folder
