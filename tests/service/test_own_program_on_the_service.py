"""Your own dataset on the service: `stallscope.distribute` puts it there with the options that matter,
and `stallscope.diagnose` of it says what the trainer can and cannot see (the stages run on the workers)."""

from __future__ import annotations

import pytest

import stallscope
from stallscope.errors import UsageError
from stallscope.service import servers


def _batches():
    import tensorflow as tf

    return tf.data.Dataset.range(10_000).map(lambda x: tf.fill([8, 8, 3], tf.cast(x, tf.float32))).batch(4)


@pytest.mark.timeout(240)
def test_diagnose_of_a_served_dataset_says_what_it_cannot_see_and_advises_nothing_for_the_workers(tmp_path):
    with servers.local_service(servers.ServiceOptions(workers=1)) as target:
        served = stallscope.distribute(_batches(), target, processing_mode="parallel_epochs", job_name="diagnosed")
        diagnosis = stallscope.diagnose(served.prefetch(2), steps=4, accelerator="emulated:20000", work_dir=tmp_path)
    notes = " ".join(diagnosis.notes)
    assert "served by the tf.data service" in notes and "not the workers' stage tree" in notes
    assert "no batch stage" not in notes  # the batch is the workers'
    assert {a.key for a in diagnosis.advice} <= {"prefetch"}
    assert "served by the tf.data service" in diagnosis.text()


def test_distribute_options_are_checked_in_one_line_naming_the_option():
    with pytest.raises(UsageError, match="^processing_mode: expected one of dynamic, parallel_epochs, got 'off'$"):
        stallscope.distribute(_batches(), "127.0.0.1:1", processing_mode="off")
    with pytest.raises(UsageError, match="^compression: expected one of none, auto, got 'snappy'$"):
        stallscope.distribute(_batches(), "127.0.0.1:1", compression="snappy")
