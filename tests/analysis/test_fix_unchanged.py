"""`diagnose --fix` where nothing in the pipeline needs changing still leaves a config that
`train --pipeline-config` runs: the diagnosed one, unchanged, saying why (and naming advice that lies
outside the pipeline config, such as a tf.data service).

"Nothing needs changing" is made so by the test, not hoped of the machine: the emulated device takes
500 ms a step, while the tuned pipeline makes a batch of 4 small JPEGs in about a millisecond; a
machine a hundred times slower or busier still keeps the prefetched batch ready long before the step
asks for it. The probes' 4 steps take 2 s, so one stall of the waiting thread of under 100 ms (a core
handed to another process) stays under the 5% of "moderately": 6 steps of 250 ms, where 75 ms was
enough, read moderately once in a loaded full run.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from stallscope.analysis.advice import Advice
from stallscope.analysis.differential import DiagnoseOptions, diagnose
from stallscope.analysis.fix_loop import keep_config
from stallscope.cli.main import main
from stallscope.pipeline.config import PipelineConfig
from stallscope.pipeline.presets import get_preset
from stallscope.workload.train import TrainOptions

SLOW_DEVICE = "emulated:500ms"   # far slower than any machine's input for 4 images of 32x32
PROBE_FLAGS = ["--batch-size", "4", "--image-size", "32", "--accelerator", SLOW_DEVICE, "--probe-steps", "4",
               "--no-cold-cache", "--pipeline-budget", "2"]


@pytest.mark.timeout(300)
def test_fix_with_nothing_to_change_saves_the_config_as_diagnosed(tiny_tree, tmp_path, capsys):
    fixed = tmp_path / "out" / "fixed-pipeline.json"
    code = main(["diagnose", "--dataset_path", str(tiny_tree), "--pipeline", "tuned", *PROBE_FLAGS,
                 "--fix", "--fixed-config", str(fixed)])
    out = capsys.readouterr().out
    assert code == 0
    assert "not input-bound" in out and "advice: none, the pipeline keeps up" in out, out
    assert "fix: no change needed: not input-bound" in out
    assert f"pipeline saved unchanged to {fixed}" in out
    saved = json.loads(fixed.read_text(encoding="utf-8"))
    assert saved["changed"] is False and "no change needed" in saved["note"]
    assert saved["advice_outside_the_pipeline"] == []
    assert saved["pipeline"] == saved["diagnosis"]["pipeline"]   # the config as diagnosed, not another
    config = PipelineConfig.load(fixed)
    assert config.preset == "tuned" and config.batch_size == 4 and config.image_size == 32
    run_dir = tmp_path / "run"
    assert main(["train", "--dataset-path", str(tiny_tree), "--pipeline-config", str(fixed), "--steps", "3",
                 "--accelerator", "emulated:1000", "--log-path", str(run_dir)]) == 0
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["pipeline"]["requested"] == config.to_dict()
    capsys.readouterr()
    # a second --fix replaces the file it saved (a pipeline config), as it would a changed one
    assert main(["diagnose", "--dataset_path", str(tiny_tree), "--pipeline", "tuned", *PROBE_FLAGS,
                 "--fix", "--fixed-config", str(fixed), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["fix"]["changed"] is False and report["fix"]["config_path"] == str(fixed)
    assert f"pipeline saved unchanged to {fixed}" in captured.err


@pytest.fixture(scope="module")
def healthy_diagnosis(tiny_tree):
    config = get_preset("tuned").replace(batch_size=4, image_size=32, shuffle_buffer=16)
    train = TrainOptions(source="files", dataset_path=tiny_tree, pipeline=config, accelerator=SLOW_DEVICE)
    return diagnose(DiagnoseOptions(train=train, probe_steps=6, pipeline_budget_s=2.0, cold_cache=False))


def test_advice_outside_the_pipeline_is_noted_beside_the_unchanged_config(healthy_diagnosis, tmp_path):
    """A tf.data service (no knob of the pipeline config) is all that is advised: the config is saved
    as it was, and the file names the advice it could not apply."""
    assert healthy_diagnosis.verdict == "not" and not healthy_diagnosis.advice
    service = Advice(key="data_service", title="Run the pipeline on a tf.data service", knobs={}, code="",
                     reason="the host's cores are the limit", evidence="", command="stallscope serve local --workers 2")
    diagnosis = dataclasses.replace(healthy_diagnosis, advice=(service,))
    path = tmp_path / "fixed.json"
    kept = keep_config(diagnosis, save_to=path)
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["changed"] is False and "the advice lies outside it (data_service)" in saved["note"]
    assert [a["key"] for a in saved["advice_outside_the_pipeline"]] == ["data_service"]
    assert PipelineConfig.load(path) == healthy_diagnosis.pipeline == kept.config


def test_keep_config_refuses_a_diagnosis_whose_advice_changes_the_pipeline(healthy_diagnosis):
    prefetch = Advice(key="prefetch", title="Prefetch at the end", knobs={"prefetch": -1}, code="", reason="",
                      evidence="")
    with pytest.raises(Exception, match="advises a pipeline change"):
        keep_config(dataclasses.replace(healthy_diagnosis, advice=(prefetch,)))
