"""The README's three API examples are the files under examples/, verbatim, and they run."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

EXAMPLE = re.compile(r"<!-- example: (\S+) -->\n```python\n(.*?)```\n<!-- /example -->", re.S)


def _examples() -> dict[str, str]:
    return dict(EXAMPLE.findall((REPO / "README.md").read_text(encoding="utf-8")))


def test_the_readme_holds_each_example_file_verbatim():
    examples = _examples()
    assert sorted(examples) == ["examples/custom_loop.py", "examples/diagnose_dataset.py",
                                "examples/keras_callback.py"]
    for path, code in examples.items():
        assert code == (REPO / path).read_text(encoding="utf-8"), f"README's copy of {path} is out of date"


@pytest.mark.parametrize("path, args, verdict", [
    ("examples/keras_callback.py", ["--stalled"], "highly"),
    ("examples/custom_loop.py", [], "not"),
    ("examples/diagnose_dataset.py", [], "highly"),
])
def test_each_example_runs(path, args, verdict, tmp_path, monkeypatch, run_script):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # their temporary directories and data stay in the test's
    done = run_script(REPO / path, *args, cwd=tmp_path)
    assert re.search(rf"^verdict: {verdict} ", done.stdout, re.M), done.stdout[-2000:]
    if path.endswith("keras_callback.py"):
        assert re.search(r"^stallscope: highly input-bound .* bottleneck: Map; top fix: ", done.stdout, re.M)
    assert os.listdir(tmp_path)
