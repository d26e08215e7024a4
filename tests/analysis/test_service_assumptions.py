"""The tf.data service sizing's link and workers' cores: assumed by default, given with --service-link
and --service-worker-cores (diagnose, analyze) or service_link= / service_worker_cores= (stallscope.diagnose);
the reports say which, and show the per-worker-count table in text, Markdown and HTML."""

from __future__ import annotations

import shutil
import types

import pytest

import stallscope
from stallscope.analysis import service_sizing as sizing
from stallscope.analysis.differential import PipelineBreakdown
from stallscope.analysis.service_advice import service_advice
from stallscope.cli.main import main
from stallscope.errors import UsageError
from stallscope.report.diagnosis import _md_advice
from stallscope.report.html import render_html
from stallscope.report.markdown import render_markdown
from stallscope.report.text import render_text, service_lines

from .test_fix_gains import _saturated_over_the_steps
from .test_service_advice import BATCH, _phase

# 96 ms of CPU per batch on 2 threads: 48 ms a batch against a 10 ms step (CPU-bound)
PARTS = PipelineBreakdown(warm_ms=48.0, cold_ms=None, cpu_ms=48.0, waiting_ms=0.0, storage_ms=0.0, threads=2.0,
                          cpu_ms_per_image=96.0 / BATCH)


def _service(assumptions=sizing.ServiceAssumptions(), image_size=128):
    return service_advice(_phase(PARTS, step_ms=48.0, wait_ms=38.0), PARTS, batch_size=BATCH, cores=2.0,
                          own_workload=False, assumptions=assumptions,
                          bytes_per_element=float(BATCH * sizing.decoded_image_bytes(image_size)))


@pytest.mark.parametrize("text, gbps", [("10Gbit/s", 10.0), ("25Gbit", 25.0), ("1250MB/s", 10.0),
                                        ("800Mbit", 0.8), ("10Gbps", 10.0), (" 40 Gbit/s ", 40.0)])
def test_link_bandwidths_are_read_in_gbit_per_second(text, gbps):
    assert sizing.parse_link_gbps(text) == pytest.approx(gbps)


@pytest.mark.parametrize("text", ["fast", "unlimited", "0Gbit", "-1Gbit", "10", ""])
def test_a_link_that_is_not_a_finite_bandwidth_is_refused(text):
    with pytest.raises(ValueError, match="a bandwidth above 0 such as 10Gbit/s"):
        sizing.parse_link_gbps(text)


def test_the_defaults_are_assumed_and_said_so():
    plan = _service().sizing
    assert plan.inputs.link_gbps == sizing.DEFAULT_LINK_GBPS and plan.inputs.worker_cores == 2.0
    assert not plan.inputs.link_given and not plan.inputs.worker_cores_given
    text = "\n".join(service_lines(plan))
    assert "workers of 2 cores, assumed: this host's free cores; link 10 Gbit/s, assumed" in text


def test_given_cores_and_link_size_the_service_and_are_said_given():
    assumed = _service().sizing
    # workers of 8 cores: each makes 4x what one of this host's 2 cores does, so fewer reach the device
    wide = _service(sizing.ServiceAssumptions(worker_cores=8.0)).sizing
    assert wide.inputs.worker_cores == 8.0 and wide.inputs.worker_cores_given and not wide.inputs.link_given
    assert wide.worker_elements_per_second == pytest.approx(4 * assumed.worker_elements_per_second)
    assert wide.ceiling.workers < assumed.ceiling.workers
    # a 1 Gbit/s link caps the service below the device, where the assumed 10 Gbit/s did not
    slow = _service(sizing.ServiceAssumptions.given("1Gbit/s"))
    assert assumed.ceiling.bound == "device"
    assert slow.sizing.inputs.link_given and slow.sizing.ceiling.bound == "link"
    assert slow.sizing.ceiling.link_mb_per_second == pytest.approx(125.0)
    assert "(the link caps it)" in slow.title and "Gbit/s of 1)" in slow.reason
    lines = "\n".join(service_lines(slow.sizing))
    assert "link 1 Gbit/s, given" in lines and "workers of 2 cores, assumed" in lines
    assert slow.sizing.to_dict()["inputs"]["link_given"] is True


@pytest.mark.parametrize("link, cores, message", [
    ("fast", None, "^service_link: expected a bandwidth above 0 such as 10Gbit/s, 25Gbit or 1250MB/s, got 'fast'$"),
    (10, None, "^service_link: expected a bandwidth such as '10Gbit/s', got 10$"),
    (None, 0, "^service_worker_cores: expected a number of cores above 0, got 0$"),
    (None, "8", "^service_worker_cores: expected a number of cores above 0, got '8'$"),
])
def test_the_api_refuses_bad_values_in_one_line_naming_the_argument(link, cores, message):
    import tensorflow as tf

    with pytest.raises(UsageError, match=message):
        stallscope.diagnose(tf.data.Dataset.range(4).batch(2), service_link=link, service_worker_cores=cores)


def test_the_api_passes_the_link_and_cores_to_the_diagnosis(monkeypatch):
    import tensorflow as tf

    from stallscope.analysis import dataset_diagnosis

    seen = []
    monkeypatch.setattr(dataset_diagnosis, "diagnose_dataset", _stopping(seen))
    with pytest.raises(_Stop):
        stallscope.diagnose(tf.data.Dataset.range(4).batch(2), service_link="25Gbit/s", service_worker_cores=16)
    with pytest.raises(_Stop):
        stallscope.diagnose(tf.data.Dataset.range(4).batch(2))
    assert seen[0].service == sizing.ServiceAssumptions(link_gbps=25.0, worker_cores=16.0)
    assert seen[1].service == sizing.ServiceAssumptions()  # the defaults: assumed


class _Stop(Exception):
    """Raised in place of the probes: what was passed is all a test of the plumbing needs."""


def _stopping(seen: list):
    def diagnose_dataset(dataset, *, model=None, options=None, progress=None):
        seen.append(options)
        raise _Stop

    return diagnose_dataset


def _exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("command", ["diagnose", "analyze"])
@pytest.mark.parametrize("flag, value, message", [
    ("--service-link", "fast", "--service-link: expected a bandwidth above 0 such as 10Gbit/s, 25Gbit or 1250MB/s, "
                               "got 'fast'"),
    ("--service-link", "unlimited", "--service-link: expected a bandwidth above 0"),
    ("--service-worker-cores", "0", "--service-worker-cores: expected a number of cores above 0 such as 8, got '0'"),
    ("--service_worker_cores", "many", "--service_worker_cores: expected a number of cores above 0"),
])
def test_bad_service_flags_end_in_one_line_naming_the_flag(tmp_path, capsys, command, flag, value, message):
    target = ["--dataset-path", str(tmp_path)] if command == "diagnose" else [str(tmp_path)]
    assert _exit_code([command, *target, flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_diagnose_flags_reach_both_kinds_of_diagnosis(tmp_path, monkeypatch):
    from stallscope.analysis import dataset_diagnosis
    from stallscope.cli import diagnose as diagnose_cli
    from stallscope.cli.main import build_parser

    args = build_parser().parse_args(["diagnose", "--dataset-path", str(tmp_path), "--service-link", "25Gbit/s",
                                      "--service-worker-cores", "8"])
    assert diagnose_cli.options_from_args(args).service == sizing.ServiceAssumptions(link_gbps=25.0, worker_cores=8.0)
    args = build_parser().parse_args(["diagnose", "--dataset-path", str(tmp_path)])
    assert diagnose_cli.options_from_args(args).service == sizing.ServiceAssumptions()

    program = tmp_path / "data_fn.py"
    program.write_text("import tensorflow as tf\n\ndef make():\n    return tf.data.Dataset.range(4).batch(2)\n")
    seen = []
    monkeypatch.setattr(dataset_diagnosis, "diagnose_dataset", _stopping(seen))
    args = build_parser().parse_args(["diagnose", "--dataset-fn", f"{program}:make", "--service-link", "1Gbit"])
    with pytest.raises(_Stop):
        diagnose_cli.diagnose_own_dataset(args, progress=lambda message: None)
    assert seen[0].service == sizing.ServiceAssumptions(link_gbps=1.0)


@pytest.fixture
def saturated_run(stalled_run, tmp_path):
    return _saturated_over_the_steps(shutil.copytree(stalled_run, tmp_path / "run"))


def test_analyze_sizes_the_service_with_the_flags_and_every_report_shows_the_table(saturated_run, tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["analyze", str(saturated_run), "--no-xprof", "--service-link", "40Gbit/s",
                 "--service-worker-cores", "16", "--html", str(page)]) == 0
    text = capsys.readouterr().out
    assert "workers of 16 cores, given; link 40 Gbit/s, given" in text
    assert "Move preprocessing to 1 tf.data service worker(s) of 16 cores" in text
    html = page.read_text()
    assert "workers of 16 cores, given; link 40 Gbit/s, given" in html
    assert "<th>workers</th><th>elements/s</th><th>limited by</th><th>link MB/s</th>" in html
    assert main(["analyze", str(saturated_run), "--no-xprof", "--markdown"]) == 0
    markdown = capsys.readouterr().out
    assert "Service what-if (workers of 2 cores, assumed: this host's free cores; link 10 Gbit/s, assumed" in markdown
    assert "| workers | elements/s | limited by | link MB/s |" in markdown


def test_the_markdown_and_html_tables_hold_the_rows_the_text_shows(saturated_run):
    from stallscope.analysis.analyze import analyze_run

    # small workers, so the table has several rows; not so small that the 64 workers the sizing allows fall
    # short of the step (0.02 cores did on a loaded machine, whose measured CPU per image was higher)
    analysis = analyze_run(saturated_run, with_xprof=False, service=sizing.ServiceAssumptions(worker_cores=0.1))
    plan = next(a for a in analysis.advice if a.key == "data_service").sizing
    assert len(plan.rows) >= 2 and plan.rows[0].workers == 1
    text, markdown, html = render_text(analysis), render_markdown(analysis), render_html(analysis)
    for row in plan.rows:
        pace = f"{row.images_per_second:,.0f}"
        assert f"| {row.workers} | {pace} | {row.bound} |" in markdown
        assert f"<tr><td>{row.workers}</td><td>{pace}</td><td>{row.bound}</td>" in html
        assert any(line.split()[:3] == [str(row.workers), pace, row.bound] for line in text.splitlines())


def test_the_diagnosis_markdown_shows_the_service_table():
    item = _service(sizing.ServiceAssumptions(link_gbps=1.0))
    diagnosis = types.SimpleNamespace(source={"kind": "dataset"}, advice=(item,))
    lines = "\n".join(_md_advice(diagnosis))
    assert "link 1 Gbit/s, given" in lines and "   | workers | images/s | limited by | link MB/s |" in lines
    for row in item.sizing.rows:
        assert f"   | {row.workers} | {row.images_per_second:,.0f} | {row.bound} | {row.link_mb_per_second:,.0f} |" \
               in lines
