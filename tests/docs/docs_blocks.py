"""Helpers for the docs tests: the code blocks of the README and of docs/**/*.md, found and run as a reader would run them.

Markers (an HTML comment on the line before a block), kept rare:
  <!-- example: PATH -->          the block is examples/PATH verbatim (tests/api run that file)
  <!-- test: skip: REASON -->     not run, for the reason given (a real bucket, a live job, a server)
  <!-- test: dry-run: REASON -->  `make TARGET` lines are checked with `make -n TARGET`
  <!-- test: exit 2 -->           each command must fail in one line with exit code 2
  <!-- test: add-flags COMMAND FLAGS -->  FLAGS are added to each `stallscope COMMAND`: the same, smaller
                                          (several commands: `COMMAND FLAGS ; COMMAND FLAGS`)
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").rglob("*.md"))
# The data set every page's folder starts with: the command Getting started gives, made once.
DATA_COMMAND = "stallscope prepare synthetic --output data --classes 4 --images-per-class 10"
BLOCK = re.compile(r"(?:<!-- (?P<marker>(?:test|example): [^\n]*?) -->\n)?^```(?P<lang>[\w-]*)\n(?P<code>.*?)^```",
                   re.S | re.M)
SHELL = {"sh", "shell", "bash", "console"}


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    marker: str
    code: str

    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    return [Block(page, text.count("\n", 0, m.start("code")), m["lang"], m["marker"] or "", m["code"])
            for m in BLOCK.finditer(text)]


def commands(code: str) -> list[list[str]]:
    """A shell block's commands: continuation lines joined, comments dropped."""
    return [words for line in code.replace("\\\n", " ").splitlines() if (words := shlex.split(line, comments=True))]


def run_stallscope(argv: list[str]) -> tuple[int, str, str]:
    """`stallscope ARGS` in this process (TensorFlow is loaded once for the suite); the environment a
    command sets (its storage settings) is put back after it."""
    from stallscope.cli.main import main

    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, out.getvalue(), err.getvalue()


def added_flags(rest: str) -> dict[str, list[str]]:
    """An add-flags marker's `COMMAND FLAGS [; COMMAND FLAGS ...]`: the flags each subcommand gets."""
    added: dict[str, list[str]] = {}
    group: list[str] = []
    for word in shlex.split(rest) + [";"]:
        if word != ";":
            group.append(word)
        elif group:
            assert group[0] not in added, f"add-flags names {group[0]} twice: {rest}"
            added[group[0]], group = group[1:], []
    return added


def run_shell_block(block: Block, cwd: Path) -> None:
    kind, _, rest = block.marker.removeprefix("test: ").partition(" ")
    added = added_flags(rest) if kind == "add-flags" else {}
    for words in commands(block.code):
        shown = f"{block.where()}: `{' '.join(words)}`"
        if kind == "dry-run:":
            assert words[0] == "make", f"{shown}: only make targets are dry-run"
            done = subprocess.run(["make", "-n", *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0 and done.stdout.strip(), f"{shown}: {done.stderr}"
        elif words[0] == "stallscope":
            code, out, err = run_stallscope(words[1:] + added.get(words[1], []))
            if kind == "exit":
                lines = [line for line in err.splitlines() if line.strip()]
                assert code == int(rest), f"{shown}: exit code {code}, expected {rest}\n{out[-2000:]}"
                assert len(lines) == 1 and re.match(rf"stallscope {words[1]}: error: ", lines[0]), f"{shown}: {err}"
            else:
                assert code == 0, f"{shown}: exit code {code}\n{out[-3000:]}\n{err[-3000:]}"
        elif words[0] in ("python", "python3"):
            done = subprocess.run([sys.executable, *words[1:]], cwd=cwd, capture_output=True, text=True,
                                  timeout=200)
            assert done.returncode == 0, f"{shown}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        else:
            pytest.fail(f"{shown}: the test runs stallscope, python and make (dry-run) only; mark the block "
                        "`<!-- test: skip: REASON -->` if it cannot run")


def run_python_block(block: Block, namespace: dict) -> None:
    """One Python session per page: a later block uses what an earlier one made, as in a notebook."""
    exec(compile(block.code, block.where(), "exec"), namespace)  # noqa: S102 - the docs' own code


def run_page(page: Path, cwd: Path) -> list[str]:
    """Runs the page's blocks in order in cwd, as a reader following it would; returns what was not run."""
    not_run, namespace = [], {"__name__": "__main__"}
    for block in blocks(page):
        if block.marker.startswith("example: "):
            continue  # the file itself runs in tests/api/test_readme_examples.py; its copy is checked there
        if block.marker.startswith("test: skip:"):
            not_run.append(f"{block.where()}: {block.marker}")
        elif block.marker and not re.match(r"test: (dry-run: |exit \d+$|add-flags )", block.marker):
            pytest.fail(f"{block.where()}: unknown marker {block.marker!r}")
        elif block.lang in SHELL:
            run_shell_block(block, cwd)
        elif block.lang == "python":
            run_python_block(block, namespace)
    return not_run
