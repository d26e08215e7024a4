"""The API examples the docs show are the files under examples/, verbatim, and they run."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

EXAMPLE = re.compile(r"<!-- example: (\S+) -->\n```python\n(.*?)```\n<!-- /example -->", re.S)


def _examples() -> list[tuple[Path, str, str]]:
    """(page, example file, the page's copy) for every example block of the README and docs/**/*.md."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [(page, path, code) for page in pages for path, code in EXAMPLE.findall(page.read_text(encoding="utf-8"))]


def test_the_docs_hold_each_example_file_verbatim():
    examples = _examples()
    assert sorted({path for _, path, _ in examples}) == sorted(
        str(p.relative_to(REPO)) for p in (REPO / "examples").glob("*.py"))
    for page, path, code in examples:
        assert code == (REPO / path).read_text(encoding="utf-8"), f"{page.name}'s copy of {path} is out of date"


# a verdict of the examples' own runs: the healthy custom loop read 5.5% input (moderately) beside
# another test under pytest -n 2
@pytest.mark.whole_machine
@pytest.mark.parametrize("path, args, verdict", [
    ("examples/keras_callback.py", ["--stalled"], "highly"),
    ("examples/custom_loop.py", [], "not"),
    ("examples/diagnose_dataset.py", [], "highly"),
])
def test_each_example_runs(path, args, verdict, tmp_path, monkeypatch, run_script):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # their temporary directories and data go in the test's
    done = run_script(REPO / path, *args, cwd=tmp_path)
    assert re.search(rf"^verdict: {verdict} ", done.stdout, re.M), done.stdout[-2000:]
    if path.endswith("keras_callback.py"):
        assert re.search(r"^stallscope: highly input-bound .* bottleneck: Map; top fix: ", done.stdout, re.M)
    # a monitor without log_dir and diagnose() without work_dir keep nothing the user did not ask for
    # (the examples' own folders and TensorFlow's autograph folder aside)
    left = [name for name in os.listdir(tmp_path) if name.startswith("stallscope-")
            and not name.startswith(("stallscope-autograph-", "stallscope-loop-", "stallscope-example-"))]
    assert left == [], left


@pytest.mark.skipif(importlib.util.find_spec("obstore") is None, reason="obstore (the storage extra) not installed")
def test_the_bucket_example_reads_and_diagnoses_a_pipeline_over_the_emulated_store(tiny_tree, tmp_path, monkeypatch,
                                                                                 run_script):
    from stallscope.storage.emulator import emulate

    with emulate(tiny_tree, kind="s3", latency_s=0.002, max_duration_s=200) as store:
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        done = run_script(REPO / "examples/bucket_pipeline.py", store.url, cwd=tmp_path)
        assert store.counters().requests >= 24  # every image came from the store
    assert re.search(r"^verdict: \w+ input share: ", done.stdout, re.M), done.stdout[-2000:]
    assert "the files are in a store (s3://data/" in done.stdout
    assert "24 file(s)" in done.stdout
    fit = re.search(r"^fit: (\d+) requests, [\d.]+ MB, ([\d.]+) ms median", done.stdout, re.M)
    assert fit and int(fit[1]) >= 5 * 8 and float(fit[2]) >= 2.0  # 5 steps of 8 images, each held 2 ms
