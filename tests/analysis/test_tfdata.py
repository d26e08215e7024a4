"""Stage tree and bottleneck walk on real profiles."""

from __future__ import annotations

from stallscope.analysis.tfdata import stage_tree
from stallscope.analysis.xplane import load_profile


def test_sequential_map_is_the_bottleneck(stalled_profile):
    tree = stage_tree(load_profile(stalled_profile))
    assert tree.chain() == ["BatchV2", "Map", "Range"]
    assert tree.bottleneck_stage.name == "Map"
    batch, mapped, source = tree.stages
    assert [s.depth for s in tree.stages] == [0, 1, 2]
    assert mapped.calls == batch.calls * 4
    # own time = total minus the nested input; the map's sleep dominates its input's time
    assert abs(mapped.own_ms - (mapped.total_ms - source.total_ms)) < 1e-6
    assert mapped.own_ms > 50 * source.total_ms
    assert mapped.per_element_us > 2500
    assert batch.own_ms < 0.2 * batch.total_ms
    assert not mapped.asynchronous and mapped.parallelism is None


def test_parallel_map_work_is_its_function_not_its_waiting(parallel_profile):
    tree = stage_tree(load_profile(parallel_profile))
    assert tree.chain() == ["Prefetch", "BatchV2", "ParallelMapV2", "Range"]
    prefetch = tree.stage("Iterator::Root::Prefetch")
    parallel = tree.stage("Iterator::Root::Prefetch::BatchV2::ParallelMapV2")
    assert prefetch.asynchronous and prefetch.own_ms == 0.0 and prefetch.parallelism == 2
    assert parallel.asynchronous and parallel.parallelism == 3
    # the function ran ~3 ms per element, several at once
    assert parallel.per_element_us > 2500
    assert parallel.concurrency > 1.2
    assert parallel.busy_ms < parallel.own_ms
    assert tree.bottleneck_stage.name == "ParallelMapV2"
    assert [w.rsplit("::", 1)[-1] for w in tree.walk] == ["Prefetch", "BatchV2", "ParallelMapV2"]


def test_healthy_pipeline_has_prefetch_outermost(healthy_profile):
    tree = stage_tree(load_profile(healthy_profile))
    assert tree.outermost.name == "Prefetch"
    assert tree.bottleneck is not None
