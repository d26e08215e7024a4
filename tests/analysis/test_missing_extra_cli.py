"""The CLI prints a missing extra as its one-line error, exit code 2."""

from __future__ import annotations

import sys

from stallscope.cli.main import main


def test_html_without_matplotlib_is_one_line_naming_the_report_extra_before_the_report(stalled_profile, tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["analyze", str(stalled_profile), "--no-xprof", "--html", str(tmp_path / "r.html")]) == 2
    out, err = capsys.readouterr()
    err = err.strip()
    assert out == "" and len(err.splitlines()) == 1  # refused before any analysis is printed
    assert err.startswith("stallscope analyze: error:") and 'pip install "stallscope[report]"' in err
