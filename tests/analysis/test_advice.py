"""Diagnosis and advice on real profiles: the fix fits the evidence and applies to a PipelineConfig."""

from __future__ import annotations

import pytest

from stallscope.analysis.advice import Advice, apply_advice, recommend
from stallscope.analysis.analyze import analyze_run
from stallscope.analysis.rewrites import rewrites
from stallscope.config import AUTOTUNE
from stallscope.errors import UsageError
from stallscope.pipeline.config import PipelineConfig


def _answers(analysis):
    return {item.key: item.answer for item in analysis.checklist}


def test_sequential_map_fix_is_a_parallel_map_and_missing_prefetch_is_found(stalled_profile):
    analysis = analyze_run(stalled_profile, with_xprof=False)
    answers = _answers(analysis)
    assert answers["get_next_slow"] == "yes"
    assert answers["prefetch_at_end"] == "no"
    assert answers["cpu_saturated"] == "unknown"  # a bare profile has no CPU samples
    assert "bare profile" in next(c.evidence for c in analysis.checklist if c.key == "cpu_saturated")
    assert answers["bottleneck"] == "Map"
    keys = [a.key for a in analysis.advice]
    assert keys[0] == "parallel_map"
    assert "prefetch" in keys
    first = analysis.advice[0]
    assert first.knobs == {"map_parallelism": AUTOTUNE}
    assert "num_parallel_calls=tf.data.AUTOTUNE" in first.code


def test_advice_skips_what_the_config_already_does(stalled_profile):
    analysis = analyze_run(stalled_profile, with_xprof=False)
    seed = PipelineConfig(preset="seed", map_parallelism=None, prefetch=None)
    done = seed.replace(map_parallelism=AUTOTUNE, prefetch=AUTOTUNE)
    assert "parallel_map" in [a.key for a in recommend(analysis, seed)]
    # advice whose knobs the config already has would change nothing, so it is left out
    keys = [a.key for a in recommend(analysis, done)]
    assert "parallel_map" not in keys and "prefetch" not in keys
    assert "max_side" in keys


def test_apply_advice_sets_the_knobs_and_skips_non_config_fixes(stalled_profile):
    analysis = analyze_run(stalled_profile, with_xprof=False)
    seed = PipelineConfig(preset="seed")
    fixed = apply_advice(seed, analysis.advice)
    assert fixed.map_parallelism == AUTOTUNE
    assert fixed.prefetch == AUTOTUNE
    assert fixed.batch_size == seed.batch_size
    assert apply_advice(seed, analysis.advice[0]).prefetch is None
    with pytest.raises(UsageError, match="knob"):
        apply_advice(seed, Advice("x", "x", {"no_such_knob": 1}, "", "", ""))


def test_healthy_pipeline_needs_no_fix(healthy_profile):
    analysis = analyze_run(healthy_profile, with_xprof=False)
    assert analysis.verdict == "not"
    assert _answers(analysis)["prefetch_at_end"] == "yes"
    assert analysis.advice == ()


def test_run_dir_reads_cpu_samples_and_names_tfs_rewrites(rewritten_run):
    analysis = analyze_run(rewritten_run, with_xprof=False)
    assert analysis.run_dir == str(rewritten_run)
    assert analysis.run is not None
    cpu = next(c for c in analysis.checklist if c.key == "cpu_saturated")
    assert cpu.answer in ("yes", "no") and "cores" in cpu.evidence
    assert "Map" in analysis.written_chain
    options = {r.option for r in analysis.rewrites}
    assert "map_parallelization" in options or "map_and_batch_fusion" in options
    assert any("became" in r.describe() for r in analysis.rewrites)
    # a profile file inside the run finds its run again
    again = analyze_run(analysis.profile_path, with_xprof=False)
    assert again.run_dir == str(rewritten_run)


def test_rewrites_name_each_change():
    changes = rewrites(["Batch", "Map", "Range"], ["Prefetch", "Batch", "ParallelMapV2", "Range"])
    assert [c.describe() for c in changes] == [
        "(nothing) became Prefetch (inject_prefetch)", "Map became ParallelMap (map_parallelization)"]
    assert rewrites(["Batch", "Map"], ["BatchV2", "Map"]) == ()


def test_config_rewrites_when_no_written_chain_was_recorded():
    from stallscope.analysis.rewrites import config_rewrites

    seed = PipelineConfig(preset="seed")
    changes = config_rewrites(seed, ["Prefetch", "Batch", "ParallelMap", "Range"])
    assert {c.option for c in changes} == {"map_parallelization", "inject_prefetch"}
    assert config_rewrites(seed.replace(map_parallelism=2, prefetch=2), ["Prefetch", "Batch", "ParallelMap"]) == ()


def test_a_run_throttled_by_its_cpu_quota_is_cpu_saturated():
    """Under a container's CPU limit the CPUs can look half idle while the quota runs out every period:
    the checklist takes the throttling as saturation and names the quota."""
    from stallscope.analysis.checklist import _cpu

    cpu = {"cores": 1.0, "cpus": 4, "quota_cores": 1.0, "samples": 20, "system_mean_percent": 60.0,
           "system_max_percent": 70.0, "throttled_s": 3.1, "throttled_share": 0.55, "duration_s": 5.0}
    item = _cpu({"cpu": cpu})
    assert item.answer == "yes" and item.needs_action
    assert "1 core (a CPU quota, on 4 CPUs)" in item.evidence
    assert "throttled in 55% of its periods, 3.10 s held back over a 5.0 s run" in item.evidence
    calm = _cpu({"cpu": {**cpu, "throttled_s": 0.01, "throttled_share": 0.02}})
    assert calm.answer == "no" and "throttled" not in calm.evidence
