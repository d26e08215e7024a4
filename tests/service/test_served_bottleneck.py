"""The bottleneck walk on a served fit: the trainer's profile holds the DataService stage and, with TF's
default compression, the map distribute() adds above it to uncompress the workers' elements. That map
is the service's receiving, not a stage of the user's pipeline: the walk passes it and says the stages
are on the workers. A map the user put after distribute() is still the trainer's and is still named."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stallscope.keras import StallMonitor
from stallscope.service import servers

from . import tiny_fit


_batches, _model = tiny_fit.batches, tiny_fit.model


def _fit(dataset, log_dir):
    monitor = StallMonitor(profile_steps=(2, 7), log_dir=log_dir, verbose=False, dataset=dataset)
    _model().fit(dataset, steps_per_epoch=10, epochs=1, verbose=0, callbacks=[monitor])
    return monitor.analysis


@pytest.mark.timeout(300)
def test_the_walk_passes_distributes_own_map_and_says_the_stages_are_on_the_workers(tmp_path):
    import tensorflow as tf

    def slow(features, label):  # the user's own trainer-side work after distribute(): 5 ms a batch
        waited = tf.py_function(lambda: (time.sleep(0.005), 0.0)[1], [], tf.float32)
        waited.set_shape([])
        return features + waited, label

    with servers.local_service(servers.ServiceOptions(workers=1)) as target:
        served = _batches().apply(tf.data.experimental.service.distribute(  # compression "AUTO", TF's default
            processing_mode="parallel_epochs", service=target, job_name="walked")).prefetch(2)
        analysis = _fit(served, tmp_path / "served")
        after = _batches().apply(tf.data.experimental.service.distribute(
            processing_mode="parallel_epochs", service=target, job_name="mapped-after")).map(slow).prefetch(2)
        mapped = _fit(after, tmp_path / "mapped")

    names = [stage.name for stage in analysis.tree.stages]
    assert names[-2:] == ["ParallelMapV2", "DataService"]  # distribute()'s uncompressing map, then the service
    assert analysis.slowest_stage == "DataService"
    assert analysis.tree.walk[-1].endswith("::DataService")
    reason = analysis.tree.reason
    assert "the stages up to distribute() run on the service's workers" in reason
    assert "distribute()'s own ParallelMapV2" in reason and "uncompress" in reason
    bottleneck = next(item for item in analysis.checklist if item.key == "bottleneck")
    assert "ParallelMapV2 was busy" not in bottleneck.evidence
    assert "run on the service's workers" in bottleneck.evidence
    assert any("served by the tf.data service" in note for note in analysis.notes)  # the DataService note stays

    # the user's map after distribute() runs on the trainer: the walk still stops at it
    assert mapped.slowest_stage == "Map"

    shown = subprocess.run([sys.executable, "-m", "stallscope", "analyze", str(tmp_path / "served")],
                           capture_output=True, text=True, timeout=180)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "slowest stage: DataService" in shown.stdout or "bottleneck: DataService" in shown.stdout
    assert "ParallelMapV2 *" in shown.stdout and "<- " not in shown.stdout.split("ParallelMapV2 *")[1].splitlines()[0]
