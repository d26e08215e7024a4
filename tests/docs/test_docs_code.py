"""Every code block of the documentation runs as written (see conftest.py for the markers)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from docs_blocks import PAGES, REPO, blocks, commands, run_page  # noqa: E402

RUNNABLE = [p for p in PAGES if any(b.lang in ("sh", "python") and not b.marker.startswith(("example:", "test: skip:"))
                                    for b in blocks(p))]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(REPO / "docs")))
def test_each_page_runs_as_written(page, page_folder):
    run_page(page, page_folder)


def test_skipped_blocks_are_rare_and_say_why():
    skipped = [(b.where(), b.marker) for p in PAGES + [REPO / "README.md"] for b in blocks(p)
               if b.marker.startswith("test: skip:")]
    run = [b for p in PAGES for b in blocks(p) if b.lang in ("sh", "python") and not b.marker.startswith("test: skip:")]
    assert all(len(marker.split("skip:", 1)[1].strip()) > 10 for _, marker in skipped), skipped
    assert len(skipped) <= len(run) // 3, skipped


def test_every_block_is_a_language_the_test_knows():
    for page in PAGES + [REPO / "README.md"]:
        for block in blocks(page):
            assert block.lang in ("sh", "python", "text"), f"{block.where()}: ```{block.lang}"


def test_every_stallscope_command_in_the_docs_names_a_real_subcommand():
    from stallscope.cli.main import SUBCOMMANDS

    names = {name for name, _, _ in SUBCOMMANDS}
    for page in PAGES + [REPO / "README.md"]:
        for block in blocks(page):
            if block.lang == "sh":
                for words in commands(block.code):
                    if words[0] == "stallscope":
                        assert words[1] in names, f"{block.where()}: {words}"


def test_the_readme_runs_as_written(page_folder):
    assert run_page(REPO / "README.md", page_folder) == []  # every block of the README runs
    assert re.search(r"^make demo\b", (REPO / "README.md").read_text(encoding="utf-8"), re.M)
