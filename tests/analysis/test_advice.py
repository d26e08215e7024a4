"""Diagnosis and advice on real profiles: the fix fits the evidence and applies to a PipelineConfig."""

from __future__ import annotations

import dataclasses

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
    assert "parallel_map" in keys and "prefetch" in keys
    parallel = next(a for a in analysis.advice if a.key == "parallel_map")
    assert parallel.knobs == {"map_parallelism": AUTOTUNE}
    assert "num_parallel_calls=tf.data.AUTOTUNE" in parallel.code
    # every fix carries its predicted gain, most first
    gains = [a.predicted_gain for a in analysis.advice]
    assert all(g >= 0.05 for g in gains) and gains == sorted(gains, reverse=True)
    # smaller images are weighed for a bottleneck map unless its dataset is known to decode none; a bare
    # profile does not say how large the stored images are, so they are checked, not advised
    assert "max_side" not in keys and "max_side" in [a.key for a in analysis.checked]
    assert "max_side" not in [a.key for a in recommend(dataclasses.replace(analysis, decodes_images=False))]


def test_advice_skips_what_the_config_already_does(stalled_profile):
    analysis = analyze_run(stalled_profile, with_xprof=False)
    seed = PipelineConfig(preset="seed", map_parallelism=None, prefetch=None)
    done = seed.replace(map_parallelism=AUTOTUNE, prefetch=AUTOTUNE)
    assert "parallel_map" in [a.key for a in recommend(analysis, seed)]
    # advice whose knobs the config already has would change nothing, so it is left out
    keys = [a.key for a in recommend(analysis, done)]
    assert "parallel_map" not in keys and "prefetch" not in keys
    assert "max_side" in keys  # weighed (its gain decides whether it is a fix)


def test_apply_advice_sets_the_knobs_and_skips_non_config_fixes(stalled_profile):
    analysis = analyze_run(stalled_profile, with_xprof=False)
    seed = PipelineConfig(preset="seed")
    fixed = apply_advice(seed, analysis.advice)
    assert fixed.map_parallelism == AUTOTUNE
    assert fixed.prefetch == AUTOTUNE
    assert fixed.batch_size == seed.batch_size
    assert apply_advice(seed, next(a for a in analysis.advice if a.key == "parallel_map")).prefetch is None
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
    # a run shorter than a sampling interval has no samples: its 0% is no figure, its quota's counters are
    short = _cpu({"cpu": {**cpu, "samples": 0, "system_mean_percent": 0.0, "throttled_share": 0.0, "duration_s": 0.1}})
    assert short.answer == "unknown" and short.evidence == "no CPU samples: the run took 0.10 s, less than one sampling interval"
    assert _cpu({"cpu": {**cpu, "samples": 0, "system_mean_percent": 0.0}}).answer == "yes"


def test_a_pipeline_on_tfs_pool_under_a_short_cpu_quota_is_advised_the_quotas_cores():
    """TF sizes tf.data's shared pool by the CPUs, not the quota: a 1.5-CPU pod on 64 CPUs whose quota
    ran out is advised a pool of 2 threads; nothing where the quota never ran short, where there is
    none or it covers every CPU, or where the pipeline has a pool of its own."""
    from stallscope.analysis.advice import quota_pool

    seed = PipelineConfig(preset="seed")
    pod = {"cpus": 64, "quota_cores": 1.5, "throttled_share": 0.6, "evidence": "ran out"}
    advice = quota_pool(seed, **pod)
    assert advice.key == "quota_pool" and advice.knobs == {"private_threadpool_size": 2}
    assert "options.threading.private_threadpool_size = 2" in advice.code and "(64)" in advice.reason
    assert apply_advice(seed, advice).private_threadpool_size == 2
    assert quota_pool(seed, **{**pod, "throttled_share": 0.05}) is None    # never short of quota
    assert quota_pool(seed, **{**pod, "throttled_share": None}) is None    # no quota counters
    assert quota_pool(seed, **{**pod, "quota_cores": None}) is None
    assert quota_pool(seed, **{**pod, "quota_cores": 64.0}) is None        # a quota of every CPU
    assert quota_pool(seed.replace(private_threadpool_size=8), **pod) is None
    unrecorded = quota_pool(None, **pod)  # a program's own profile: its pool is not recorded
    assert unrecorded.knobs == {"private_threadpool_size": 2} and "where the pipeline sets no pool" in unrecorded.reason
    assert "where the pipeline sets no pool" not in advice.reason


def test_a_storage_pool_wins_over_the_quotas_pool():
    """Reads in flight hold threads that wait, so the storage advice's pool (reads + cores) is kept
    and the quota's pool, which would leave too few threads to wait on reads, is dropped."""
    from stallscope.analysis.advice import merge_advice, quota_pool

    pool = quota_pool(PipelineConfig(preset="seed"), cpus=8, quota_cores=2.0, throttled_share=0.5, evidence="")
    reads = Advice("reads_in_flight", "", {"read_parallelism": 16, "private_threadpool_size": 18}, "", "", "")
    cache = Advice("cache", "", {"cache": "memory", "cache_at": "encoded"}, "", "", "")
    assert [a.key for a in merge_advice([pool], [reads])] == ["reads_in_flight"]
    assert [a.key for a in merge_advice([pool], [cache])] == ["cache", "quota_pool"]


def test_a_run_held_back_by_its_quota_on_tfs_pool_is_advised_the_quotas_cores(rewritten_run, tmp_path):
    """`analyze` of a run directory: resources.json says a 1-CPU quota on 4 CPUs ran out; the run's
    requested config used TF's shared pool."""
    import json
    import shutil

    run = shutil.copytree(rewritten_run, tmp_path / "run")
    pipeline = json.loads((run / "pipeline.json").read_text())
    (run / "pipeline.json").write_text(json.dumps({**pipeline, "requested": PipelineConfig(preset="seed").to_dict()}))
    resources = json.loads((run / "resources.json").read_text())
    resources["cpu"].update(cpus=4, cores=1.0, quota_cores=1.0, throttled_s=2.0, throttled_share=0.7)
    (run / "resources.json").write_text(json.dumps(resources))
    analysis = analyze_run(run, with_xprof=False)
    pool = next(a for a in analysis.advice if a.key == "quota_pool")
    assert pool.knobs == {"private_threadpool_size": 1}
    assert "throttled in 70% of its periods" in pool.evidence


def test_a_diagnosis_lists_its_fixes_by_predicted_gain():
    """`diagnose` found its fixes storage first and priced them after (+3,244%, +12%, +12%, +12%, +75%,
    +256% in one report, documented as "most helpful first"): now the marker fix, then by gain, highest
    first, then the unpredicted; ties keep the order found."""
    from stallscope.analysis.differential import most_helpful_first

    def fix(key, gain):
        return Advice(key=key, title=key, knobs={}, code="", reason="", evidence="", predicted_gain=gain)

    found = [fix("cache", 32.44), fix("a", 0.12), fix("quota_pool", None), fix("b", 0.12), fix("prefetch", 0.75),
             fix("reads_in_flight", 2.56), fix("step_marker", None)]
    assert [a.key for a in most_helpful_first(found)] == [
        "step_marker", "cache", "reads_in_flight", "prefetch", "a", "b", "quota_pool"]
