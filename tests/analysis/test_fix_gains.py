"""No fix that does not help, no verdict that contradicts another: every fix carries the what-if
model's predicted gain, a change predicted to gain under 5% is only checked, a saturated CPU is judged
over the training steps and gets CPU-bound advice, and the reports warn where the figures are thin."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from stallscope.analysis.analyze import analyze_run
from stallscope.report.html import render_html
from stallscope.report.markdown import render_markdown
from stallscope.report.text import render_text

RENDERERS = [render_text, render_markdown, render_html]


def _answers(analysis):
    return {item.key: item for item in analysis.checklist}


def _saturated_over_the_steps(run, *, inside: float = 92.0, outside: float = 20.0, run_mean: float = 69.0):
    """resources.json of a 2-core host busy `inside`% over the training steps and idle around them
    (start-up, validation), this process doing nearly all of that work (the run's own CPU is what fills
    the cores, not another program's): its whole-run mean is `run_mean`, as a Keras fit on 2 cores measured."""
    from stallscope.workload import rundir

    records = [r for r in rundir.read_steps(run) if not r.warmup]
    start, end = min(r.started_s for r in records), max(r.started_s + r.step_ms / 1e3 for r in records)
    resources = json.loads((run / "resources.json").read_text())
    half = resources["interval_s"] / 2
    for sample in resources["samples"]:
        sample["system_percent"] = inside if start <= sample["elapsed_s"] - half <= end else outside
        sample["process_percent"] = 0.95 * sample["system_percent"] * 2  # percent of one core, of 2 cores' busy
    resources["cores"] = 2.0
    resources["cpu"].update(cores=2.0, cpus=2, quota_cores=None, throttled_s=None, throttled_share=None,
                            system_mean_percent=run_mean, system_max_percent=inside)
    (run / "resources.json").write_text(json.dumps(resources))
    assert sum(start <= s["elapsed_s"] - half <= end for s in resources["samples"]) >= 2
    return run


@pytest.fixture
def saturated_run(stalled_run, tmp_path):
    return _saturated_over_the_steps(shutil.copytree(stalled_run, tmp_path / "run"))


def test_saturation_is_judged_over_the_training_steps(saturated_run):
    analysis = analyze_run(saturated_run, with_xprof=False)
    cpu = _answers(analysis)["cpu_saturated"]
    assert cpu.answer == "yes", cpu.evidence
    assert "92% busy on average over the training steps" in cpu.evidence
    assert "69% over the whole run" in cpu.evidence
    assert analysis.cpu_window is not None and analysis.cpu_window.mean_percent == pytest.approx(92.0)
    assert analysis.to_dict()["cpu_over_steps"]["mean_percent"] == pytest.approx(92.0)


def test_a_saturated_cpu_gets_cpu_bound_advice_not_more_parallelism(saturated_run):
    analysis = analyze_run(saturated_run, with_xprof=False)
    assert analysis.input_bound and analysis.bottleneck == "Map"
    fixes = {a.key: a for a in analysis.advice}
    checked = {a.key: a for a in analysis.checked}
    # more parallelism and an overlap need idle cores: none over the steps, so no gain is predicted
    assert "parallel_map" not in fixes and checked["parallel_map"].predicted_gain < 0.05
    assert "prefetch" not in fixes and checked["prefetch"].predicted_gain < 0.05
    assert "outer_parallelism" not in fixes
    # what helps a CPU-bound pipeline: less work per image, or more machines (with how many)
    assert fixes["cache"].knobs == {"cache": "memory", "cache_at": "decoded"}
    service = fixes["data_service"]
    assert "tf.data service worker(s)" in service.title and any(ch.isdigit() for ch in service.title)
    assert "train --data-service" not in service.command    # a user's program: no stallscope train flag
    assert service.sizing is not None and service.sizing.rows[0].workers == 1
    assert all(a.predicted_gain >= 0.05 for a in analysis.advice)
    text = render_text(analysis)
    assert "the CPU is the limit" in text
    assert "Decode in parallel: checked, no gain expected" in text


def test_every_fix_carries_its_predicted_gain_in_every_report(stalled_profile):
    analysis = analyze_run(stalled_profile, with_xprof=False)
    assert analysis.advice and all(a.predicted_gain >= 0.05 and a.predicted_step_ms > 0 for a in analysis.advice)
    for item in analysis.advice:
        assert item.predicted_step_ms == pytest.approx(analysis.steps.step_ms.mean / (1 + item.predicted_gain))
    shown = f"{analysis.advice[0].predicted_gain:+.0%} predicted"
    for render in RENDERERS:
        assert shown in render(analysis)
    data = json.loads(analysis.to_json())
    assert all(isinstance(a["predicted_gain"], float) for a in data["advice"])
    assert {a["key"] for a in data["checked"]} == {a.key for a in analysis.checked}


def test_an_asynchronous_last_stage_is_the_prefetch(map_and_batch_profile):
    """MapAndBatch makes batches ahead on its own threads: no 'without a prefetch' claim, no prefetch fix."""
    analysis = analyze_run(map_and_batch_profile, with_xprof=False)
    assert analysis.tree.outermost.name.startswith("MapAndBatch")
    prefetch = _answers(analysis)["prefetch_at_end"]
    assert prefetch.answer == "yes" and "asynchronous" in prefetch.evidence and not prefetch.needs_action
    assert "prefetch" not in [a.key for a in analysis.advice]
    for render in RENDERERS:
        assert "made only when the step asks" not in render(analysis)


def test_a_generator_under_a_cache_is_the_bottleneck_not_the_cache(generator_cached_profile):
    analysis = analyze_run(generator_cached_profile, with_xprof=False)
    assert analysis.input_bound and analysis.bottleneck == "Generator"
    cache = next(s for s in analysis.tree.stages if s.name == "MemoryCache")
    assert [analysis.tree.stage(i).name for i in cache.inputs] == ["MemoryCacheImpl"]
    assert "has no input" not in _answers(analysis)["bottleneck"].evidence.split(":")[0]
    assert "parallel_generator" in [a.key for a in analysis.advice]
    assert "cache" not in [a.key for a in analysis.advice]         # it caches already
    assert "caches already" in next(a.gain_basis for a in analysis.checked if a.key == "cache")
    for render in RENDERERS:
        assert "keeps up" not in render(analysis)


@pytest.mark.parametrize("render", RENDERERS)
def test_an_input_bound_run_without_a_fix_never_says_it_keeps_up(stalled_profile, render):
    analysis = dataclasses.replace(analyze_run(stalled_profile, with_xprof=False), advice=())
    report = render(analysis)
    assert "keeps up" not in report and "none needed" not in report.lower()
    assert "none found" in report.lower() and "highly input-bound" in report


def test_generator_cache_advice_says_the_generator_must_end(generator_profile):
    analysis = analyze_run(generator_profile, with_xprof=False)
    cache = next(a for a in [*analysis.advice, *analysis.checked] if a.key == "cache")
    assert "endless" in cache.reason and ".repeat()" in cache.code
    assert "must stop" in cache.code


def _with_stored_images(run, folder, side: tuple[int, int], image_size: int = 224):
    from PIL import Image

    folder.mkdir()
    for index in range(3):
        Image.new("RGB", side, (index * 40, 90, 160)).save(folder / f"{index}.jpg", quality=90)
    (run / "summary.json").write_text(json.dumps({
        "image_size": image_size, "dataset_size": 3,
        "source": {"kind": "files", "path": str(folder), "schema": "standard"}}))
    return run


def test_smaller_images_are_advised_only_from_twice_the_models_input(stalled_run, tmp_path):
    small = _with_stored_images(shutil.copytree(stalled_run, tmp_path / "small"), tmp_path / "img256", (256, 256))
    analysis = analyze_run(small, with_xprof=False)
    assert analysis.stored.side == 256 and analysis.image_size == 224
    assert "max_side" not in [a.key for a in analysis.advice]
    checked = next(a for a in analysis.checked if a.key == "max_side")
    assert "256 px" in checked.gain_basis and "under 2x" in checked.gain_basis
    large = _with_stored_images(shutil.copytree(stalled_run, tmp_path / "large"), tmp_path / "img640", (640, 480))
    analysis = analyze_run(large, with_xprof=False)
    advised = next(a for a in analysis.advice if a.key == "max_side")
    assert "--max-side 256" in advised.command and advised.predicted_gain >= 0.05
    assert "640 px" in advised.reason


def test_a_verdict_from_few_counted_steps_is_warned_about_in_every_format(few_steps_profile):
    analysis = analyze_run(few_steps_profile, with_xprof=False)
    assert analysis.steps.counted_steps == 1 and analysis.verdict == "highly"
    assert len(analysis.warnings) == 1 and "only 1 step counted" in analysis.warnings[0]
    for render in RENDERERS:
        assert "only 1 step counted" in render(analysis)
    assert json.loads(analysis.to_json())["warnings"] == list(analysis.warnings)


def test_enough_steps_give_no_warning(stalled_profile):
    analysis = analyze_run(stalled_profile, with_xprof=False)
    assert analysis.steps.counted_steps >= 5 and analysis.warnings == ()
    assert "warning:" not in render_text(analysis)


def test_xprof_without_steps_says_it_counts_only_r1_markers(unmarked_profile):
    """Markers numbered without _r=1 (as Keras' 'Profiled batch' spans): stallscope finds the steps, XProf none."""
    analysis = analyze_run(unmarked_profile)
    assert len(analysis.steps.steps) == 8 and analysis.xprof is not None
    if analysis.xprof.error:
        pytest.skip(f"xprof did not run here: {analysis.xprof.error}")
    assert analysis.xprof.input_share is None
    text = render_text(analysis)
    assert "XProf counts only steps marked with _r=1" in text and "stallscope found 8 steps" in text
    assert "no figure (no steps found)" not in text


def test_a_bare_profile_names_every_way_to_record_cpu(stalled_profile):
    cpu = _answers(analyze_run(stalled_profile, with_xprof=False))["cpu_saturated"]
    assert cpu.answer == "unknown"
    for way in ("StallMonitor", "stallscope.profile", "profile_batch"):
        assert way in cpu.evidence


def test_a_pause_between_steps_is_left_out_of_the_cpu_over_the_steps():
    """Two epochs of 20 ms steps with 2 s of validation between them: its idle samples are not the steps'."""
    from stallscope.analysis.cpu_window import cpu_over_steps
    from stallscope.workload.rundir import StepRecord

    def steps(first: int, start_s: float):
        return [StepRecord(step=first + i, phase="train", started_s=start_s + 0.02 * i, step_ms=20.0,
                           input_wait_ms=1.0, compute_ms=19.0, images=8, warmup=first + i == 1) for i in range(50)]

    records = [*steps(1, 0.0), *steps(51, 3.0)]             # steps 0-1 s and 3-4 s, validation between
    samples = [{"elapsed_s": 0.25 * k, "process_percent": 150.0,
                "system_percent": 20.0 if 1.1 < 0.25 * k - 0.125 < 3.0 else 95.0} for k in range(1, 17)]
    window = cpu_over_steps({"interval_s": 0.25, "cores": 2, "samples": samples}, records)
    assert window.mean_percent == pytest.approx(95.0) and window.samples == 8
    assert window.start_s == pytest.approx(0.02) and window.end_s == pytest.approx(4.0)
    assert window.process_cores == pytest.approx(1.5)


def test_a_step_of_several_batches_is_priced_per_batch_as_the_pipeline_is():
    """Keras' steps_per_execution=4: a step of fit's train function is 4 batches, the pipeline's figures
    one batch each. Set side by side, a parallel decode was priced at +124% where it gained +53%
    (benchmarks/advice_programs.py; one batch a step: +75% / +60%). Split per batch, the same program
    is priced as the one-batch program with the same figures is."""
    from stallscope.analysis.advice import Advice
    from stallscope.analysis.differential import PipelineBreakdown, attribute, price_advice
    from stallscope.pipeline.config import PipelineConfig

    from .conftest import loop_probe

    parts = PipelineBreakdown(warm_ms=26.0, cold_ms=None, cpu_ms=26.0, waiting_ms=0.0, storage_ms=0.0, threads=1.0,
                              cpu_ms_per_image=26.0 / 32)
    config = PipelineConfig(batch_size=32)
    decode = Advice("parallel_map", "Decode in parallel", {"map_parallelism": -1}, "", "", "")
    four = attribute(compute=loop_probe("compute", 8.0, 0.0, 8.0), end_to_end=loop_probe("end_to_end", 112.0, 104.0, 8.0),
                     parts=parts, batch_size=32, cores=2.0, phase="train", batches_per_step=4)
    one = attribute(compute=loop_probe("compute", 2.0, 0.0, 2.0), end_to_end=loop_probe("end_to_end", 28.0, 26.0, 2.0),
                    parts=parts, batch_size=32, cores=2.0, phase="train")
    assert four.compute_ms == pytest.approx(2.0) and four.step_ms == pytest.approx(28.0)
    assert four.input_wait_ms == pytest.approx(26.0) and four.input_share == pytest.approx(one.input_share)
    assert four.overlapped == one.overlapped is False
    (priced_four,), _ = price_advice([decode], (four,), parts, config, cores=2.0)
    (priced_one,), _ = price_advice([decode], (one,), parts, config, cores=2.0)
    assert priced_four.predicted_gain == pytest.approx(priced_one.predicted_gain)
    assert 0.5 < priced_four.predicted_gain < 1.0  # 28 ms in turn -> 2 + 13 ms
