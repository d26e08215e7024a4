"""`stallscope analyze`: report forms and one-line errors."""

from __future__ import annotations

import json

import stallscope
from stallscope.cli.main import main


def test_json_has_top_level_input_share_and_bottleneck(stalled_profile, capsys):
    assert main(["analyze", str(stalled_profile), "--json", "--no-xprof"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data["input_share"], float) and 0.0 <= data["input_share"] <= 1.0
    assert data["bottleneck"] == "Map"
    assert data["verdict"] == "highly"
    assert {s["name"] for s in data["stages"]} == {"BatchV2", "Map", "Range"}
    assert {"map_parallelism": -1} in [a["knobs"] for a in data["advice"]]
    assert all(isinstance(a["predicted_gain"], float) for a in data["advice"])


def test_the_python_api_returns_what_the_command_prints(stalled_profile, capsys):
    """`stallscope.analyze(PATH)`: the Analysis whose to_dict() is the command's --json, fields read as documented."""
    analysis = stallscope.analyze(stalled_profile, with_xprof=False)
    assert main(["analyze", str(stalled_profile), "--json", "--no-xprof"]) == 0
    assert json.loads(analysis.to_json()) == json.loads(capsys.readouterr().out)
    assert analysis.verdict == "highly" and analysis.input_bound and analysis.bottleneck == "Map"
    assert 0.0 <= analysis.input_share <= 1.0 and {s.name for s in analysis.tree.stages} == {"BatchV2", "Map", "Range"}


def test_text_markdown_and_html(stalled_profile, tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["analyze", str(stalled_profile), "--no_xprof", "--html", str(page)]) == 0
    text = capsys.readouterr().out
    assert "highly input-bound" in text and "<- bottleneck" in text and "Decode in parallel" in text
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 2 and "Map" in html
    assert main(["analyze", str(stalled_profile), "--no-xprof", "--markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("# Input pipeline analysis") and "**Map** (bottleneck) |" in markdown


def test_path_without_profile_is_one_line_exit_2(tmp_path, capsys):
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no TF profile found" in err and str(tmp_path) in err
    assert main(["analyze", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err



def test_unwritable_html_is_refused_before_the_report(stalled_profile, tmp_path, capsys):
    (tmp_path / "a_file").write_text("not a folder")
    for target in (tmp_path / "missing" / "report.html", tmp_path / "a_file" / "report.html"):
        assert main(["analyze", str(stalled_profile), "--no-xprof", "--html", str(target)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # refused before any report is printed
        assert captured.err.count("\n") == 1 and "--html" in captured.err and str(target.parent) in captured.err
