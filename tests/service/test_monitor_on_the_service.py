"""StallMonitor on a fit whose dataset the tf.data service serves: the steps are timed and profiled as
on any fit, and the analysis says what the trainer cannot see (the stage tree is on the workers) and
advises no service for an input that already has one."""

from __future__ import annotations

import pytest

from stallscope.keras import StallMonitor
from stallscope.report.html import render_html
from stallscope.report.markdown import render_markdown
from stallscope.report.text import render_text
from stallscope.service import servers

from . import tiny_fit


_batches, _model = tiny_fit.batches, tiny_fit.model


@pytest.mark.timeout(240)
def test_stall_monitor_on_a_served_dataset_times_its_steps_and_says_the_stages_are_on_the_workers(tmp_path):
    import tensorflow as tf

    with servers.local_service(servers.ServiceOptions(workers=1)) as target:
        served = _batches().apply(tf.data.experimental.service.distribute(
            processing_mode="parallel_epochs", service=target, job_name="monitored")).prefetch(2)
        monitor = StallMonitor(profile_steps=(2, 7), log_dir=tmp_path / "log", verbose=False, dataset=served)
        _model().fit(served, steps_per_epoch=10, epochs=1, verbose=0, callbacks=[monitor])
    assert [r.step for r in monitor.records] == list(range(1, 11))
    assert all(r.step_ms > 0 for r in monitor.records)
    assert (tmp_path / "log" / "steps.csv").read_text().count("\n") == 1 + 10
    analysis = monitor.analysis
    assert analysis is not None and analysis.steps.counted_steps >= 1 and analysis.steps.step_ms.mean > 0
    assert analysis.input_share is not None
    assert "DataService" in {stage.name for stage in analysis.tree.stages}
    assert "DataService" in analysis.written_chain and "DataService" in analysis.ran_chain
    notes = " ".join(analysis.notes)
    assert "served by the tf.data service" in notes and "not the workers' stage tree" in notes
    assert "data_service" not in {a.key for a in (*analysis.advice, *analysis.checked)}
    said = "the stages up to distribute() run on the service's workers"
    assert said in render_text(analysis) and said in render_markdown(analysis)
    assert said.replace("'", "&#x27;") in render_html(analysis)
    assert analysis.to_dict()["notes"] == list(analysis.notes)
