"""Commands that need no TensorFlow answer without importing it (its import alone takes seconds).

Each runs in a fresh interpreter, which then reports whether tensorflow, keras or scikit-learn was
ever imported: a behaviour check, not a timing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stallscope.records.convert import ConvertOptions, convert_tree

HEAVY = ("tensorflow", "keras", "sklearn")
# Runs the CLI in-process, then prints which of HEAVY were imported as the last line of stdout.
PROBE = ("import json, sys; from stallscope.cli.main import main; code = main(sys.argv[1:]); "
         f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules])); raise SystemExit(code)")


def _heavy_imports(*argv: str, expect_rc: int = 0) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == expect_rc, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_analyze_of_a_profile_imports_no_tensorflow(stalled_profile, tmp_path):
    assert _heavy_imports("analyze", str(stalled_profile), "--html", str(tmp_path / "report.html")) == []
    assert (tmp_path / "report.html").stat().st_size > 0
    assert _heavy_imports("analyze", str(stalled_profile), "--json", "--no-xprof") == []


def test_verify_without_decoding_imports_no_tensorflow(tiny_tree, tmp_path):
    out = tmp_path / "records"
    convert_tree(ConvertOptions(tiny_tree, out, shards=2, workers=1))
    assert _heavy_imports("verify", str(out), "--no-decode") == []


def test_help_and_one_line_errors_import_no_tensorflow(tmp_path):
    assert _heavy_imports("analyze", str(tmp_path), expect_rc=2) == []


def test_storage_emulator_and_reports_import_no_tensorflow():
    code = ("import sys; import stallscope.storage.emulator.serving, stallscope.storage.emulator, "
            "stallscope.report.text, stallscope.report.html, stallscope.report.markdown; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
