"""The wheel `python -m build` makes installs into a fresh venv, and the Keras example runs from it.

Why: an editable install hides what a wheel leaves out (a module, package data, an entry point).
TensorFlow is not installed again from the network: the fresh venv sees this one's third-party
packages through a .pth line placed after its own site-packages, and stallscope itself only from
the wheel (installed with --no-deps --no-index); every command runs outside the source tree.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("build", reason="the build package is not installed (the `release` extra, which `test` pulls in)")

ROOT = Path(__file__).parents[1]


def _run(argv: list, cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}: {done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the tree (so no build/ or egg-info lands in the checkout), without isolation:
    the setuptools already here, no download."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", work / "dist", source], cwd=work)
    (found,) = (work / "dist").glob("stallscope-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("venv") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", where], cwd=where.parent)
    python = where / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=where).strip())
    # zz-: read after anything the wheel installs; a plain path line, so this venv's .pth files (the editable
    # install's among them) are not run there
    (purelib / "zz-third-party.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel],
         cwd=where.parent)
    return where


def test_the_wheel_holds_every_module_and_the_console_script(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    sources = {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "stallscope").rglob("*.py")}
    assert sources <= set(names)
    assert "stallscope/py.typed" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "stallscope = stallscope.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.timeout(900)
def test_the_keras_example_runs_from_the_installed_wheel(venv, tmp_path):
    python = venv / "bin" / "python"
    where = _run([python, "-c", "import stallscope; print(stallscope.__file__, stallscope.__version__)"], cwd=tmp_path)
    path, version = where.split()
    assert Path(path).is_relative_to(venv) and version == _run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('stallscope'))"], cwd=tmp_path).strip()
    assert _run([venv / "bin" / "stallscope", "--version"], cwd=tmp_path).strip() == f"stallscope {version}"

    example = shutil.copy2(ROOT / "examples" / "keras_callback.py", tmp_path / "keras_callback.py")
    out = _run([python, example, tmp_path / "log"], cwd=tmp_path, timeout=600)
    assert "verdict:" in out and "input share:" in out
    report = _run([venv / "bin" / "stallscope", "analyze", tmp_path / "log", "--json", "--no-xprof"], cwd=tmp_path)
    assert '"input_share"' in report
