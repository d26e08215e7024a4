"""Figures the report must not invent: no share or verdict for steps that hold no input wait, advice
that fits the source it names, and a printed share that never contradicts its verdict."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from stallscope.analysis.analyze import analyze_run
from stallscope.analysis.checklist import checklist
from stallscope.pipeline.config import PipelineConfig
from stallscope.report.html import render_html
from stallscope.report.markdown import render_markdown
from stallscope.report.text import render_text
from stallscope.verdict import fmt_share, verdict_for


def _answers(analysis):
    return {item.key: item for item in analysis.checklist}


# --- a loop that fetches its batch before the step marker opens ---------------------------------

def test_batches_fetched_outside_the_steps_give_no_share_and_no_verdict(fetched_outside_profile):
    analysis = analyze_run(fetched_outside_profile, with_xprof=False)
    assert not analysis.steps.has_iterator
    assert analysis.input_share is None and analysis.verdict is None
    assert not analysis.input_bound and analysis.bottleneck is None
    data = json.loads(analysis.to_json())
    assert data["input_share"] is None and data["verdict"] is None and data["input_bound"] is None
    assert data["steps"]["input_ms"] is None and data["steps"]["compute_ms"] is None
    answers = _answers(analysis)
    assert answers["get_next_slow"].answer == "unknown"
    assert answers["bottleneck"].answer == "unknown"
    assert "keeps up" not in answers["bottleneck"].evidence.replace("whether the input keeps up", "")


def test_the_wait_between_the_steps_is_measured_there_and_the_fix_is_the_marker(fetched_outside_profile):
    analysis = analyze_run(fetched_outside_profile, with_xprof=False)
    between = analysis.steps.between
    assert between is not None and between.calls >= analysis.steps.counted_steps
    # the stalled map: 4 elements x 3 ms each, sequential, made while no step is open
    assert between.wait_ms.mean > 8.0 and between.share > 0.3
    assert [a.key for a in analysis.advice][0] == "step_marker"
    assert "next(iterator)" in analysis.advice[0].code
    assert any("between the step markers" in note for note in analysis.notes)
    assert not any("NumPy" in note for note in analysis.notes)


@pytest.mark.parametrize("render", [render_text, render_markdown, render_html])
def test_no_report_says_the_input_keeps_up_when_nothing_measured_it(fetched_outside_profile, render):
    analysis = analyze_run(fetched_outside_profile, with_xprof=False)
    report = render(analysis)
    assert "not measurable" in report and "between the step markers" in report
    assert "none needed" not in report.lower() and "the input keeps up (" not in report
    # a made-up zero share, not a measured one such as the wait between the steps ("60.0%")
    assert not re.search(r"(?<![\d.])0\.0%", report) and "not input-bound" not in report
    assert "NumPy" not in report


def test_an_unmeasured_share_with_nothing_to_advise_says_so(fetched_outside_profile):
    analysis = analyze_run(fetched_outside_profile, with_xprof=False)
    bare = dataclasses.replace(analysis, advice=())
    assert "Fix: none advised; the input share was not measured" in render_text(bare)
    assert "None needed" not in render_markdown(bare)


# --- a Python generator source ------------------------------------------------------------------

def test_a_generator_source_gets_generator_advice_not_file_reading_advice(generator_profile):
    analysis = analyze_run(generator_profile, with_xprof=False)
    assert analysis.input_bound and analysis.bottleneck == "Generator"
    keys = [a.key for a in analysis.advice]
    assert "parallel_generator" in keys
    assert "parallel_interleave" not in keys and "more_shards" not in keys
    first = next(a for a in analysis.advice if a.key == "parallel_generator")
    assert first.knobs == {} and "from_generator" in first.code and "GIL" in first.reason
    cache = next(a for a in analysis.advice if a.key == "cache")
    assert cache.knobs == {} and "encoded" not in cache.title
    text = render_text(analysis)
    assert "shard" not in text.lower() and "TFRecordDataset" not in text
    assert "one file at a time" not in text


def test_flags_are_shown_only_for_stallscopes_own_workload(stalled_profile):
    """A user's own pipeline (no pipeline.json requested config) gets code, not `stallscope train` flags."""
    analysis = analyze_run(stalled_profile, with_xprof=False)
    assert analysis.config is None and analysis.advice[0].knobs  # the knobs stay for apply_advice
    assert "[--map-parallelism" not in render_text(analysis)
    assert "`--map-parallelism" not in render_markdown(analysis)
    own = dataclasses.replace(analysis, config=PipelineConfig())
    assert "[--map-parallelism autotune]" in render_text(own)


# --- a share just under a threshold -------------------------------------------------------------

@pytest.mark.parametrize("share, shown", [(0.0471, "4.7%"), (0.0496, "4.9%"), (0.04999, "4.9%"), (0.05, "5.0%"),
                                          (0.1996, "19.9%"), (0.2, "20.0%"), (0.29, "29.0%"), (0.0, "0.0%")])
def test_a_share_is_never_printed_as_the_threshold_it_is_below(share, shown):
    assert fmt_share(share) == shown
    assert verdict_for(float(fmt_share(share)[:-1]) / 100) == verdict_for(share)


def test_whole_percent_shares_round_down_below_a_threshold():
    assert fmt_share(0.0471, 0) == "4%" and fmt_share(0.1951, 0) == "19%" and fmt_share(0.0449, 0) == "4%"
    assert fmt_share(0.0551, 0) == "6%" and fmt_share(None) == "n/a"


def test_reports_print_a_near_threshold_share_beside_its_verdict_consistently(healthy_profile):
    analysis = analyze_run(healthy_profile, with_xprof=False)
    near = dataclasses.replace(analysis.steps, input_share=0.0496, verdict="not")
    analysis = dataclasses.replace(analysis, steps=near, checklist=checklist(near, analysis.tree, None))
    for render in (render_text, render_markdown):
        report = render(analysis)
        assert "Input share 4.9%: not input-bound" in report
        assert "5.0%" not in report
    assert "4.9% of step time" in _answers(analysis)["get_next_slow"].evidence
