"""A missing optional package is one line naming the `pip install` that adds it; the extras it names exist."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from stallscope.errors import StallscopeError
from stallscope.extras import EXTRAS, install_line, needs_extra

PYPROJECT = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
OPTIONAL = PYPROJECT["project"]["optional-dependencies"]


def test_every_named_extra_is_in_pyproject_and_all_installs_the_features():
    assert set(EXTRAS) <= set(OPTIONAL)
    features = set(EXTRAS) - {"cpu", "demo"}
    assert OPTIONAL["all"] == [f"stallscope[{','.join(sorted(features, key=list(EXTRAS).index))}]"]


def test_the_core_leaves_out_every_extra_package():
    core = {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower() for d in PYPROJECT["project"]["dependencies"]}
    assert core.isdisjoint({"tensorflow", "tensorflow-cpu", "keras", "matplotlib", "scikit-image", "scikit-learn",
                            "xprof", "tensorflow-datasets", "s3fs", "obstore", "apache-beam"})


def test_a_missing_package_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(StallscopeError) as exc:
        with needs_extra("report", "an HTML report's plots"):
            import matplotlib  # noqa: F401
    message = str(exc.value)
    assert "\n" not in message and "matplotlib" in message and 'pip install "stallscope[report]"' in message


def test_an_unknown_extra_is_a_programming_error():
    with pytest.raises(ValueError, match="expected one of"):
        install_line("plots")


def test_the_built_in_data_set_without_its_extra_stops_before_any_worker_starts(tmp_path, monkeypatch):
    from stallscope.data.synthetic import make_synthetic

    monkeypatch.setitem(sys.modules, "sklearn", None)
    with pytest.raises(StallscopeError, match=r'pip install "stallscope\[data\]"'):
        make_synthetic(tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_a_command_that_needs_tensorflow_without_it_is_one_line_naming_the_cpu_extra(tmp_path):
    program = (
        "import sys, importlib.abc\n"
        "class NoTF(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'tensorflow':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoTF())\n"
        "from stallscope.cli.main import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", program, "train", "--source", "files", "--dataset_path",
                           str(tmp_path), "--steps", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ('stallscope train: error: this command needs tensorflow, which is not installed '
                                   '(TensorFlow (CPU build)): pip install "stallscope[cpu]"')
