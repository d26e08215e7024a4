"""Presets, overrides, validation of knob values, and the config's JSON round trip."""

from __future__ import annotations

import json

import pytest

from stallscope.config import AUTOTUNE
from stallscope.cpu_limits import CpuLimits
from stallscope.errors import UsageError
from stallscope.pipeline.config import STATIC_OPTIMIZATIONS, PipelineConfig
from stallscope.pipeline.presets import OFF, PRESETS, get_preset, overridden_fields, resolve_pipeline


def test_seed_preset_is_what_the_seeds_wrote():
    seed = get_preset("seed")
    assert (seed.batch_size, seed.image_size, seed.shuffle_buffer, seed.shuffle_at) == (32, 224, 10240, "decoded")
    assert seed.map_parallelism is None and seed.prefetch is None and seed.read_parallelism is None
    assert seed.normalize == "minus_one_one" and seed.drop_remainder is False
    assert all(getattr(seed, name) is False for name in STATIC_OPTIMIZATIONS)


def test_autotune_and_tuned_presets():
    autotune, tuned = get_preset("autotune"), get_preset("tuned")
    assert autotune.map_parallelism == autotune.prefetch == autotune.read_parallelism == AUTOTUNE
    assert tuned.deterministic is True and tuned.normalize == "none" and tuned.shuffle_at == "encoded" and tuned.decode == "full"
    assert tuned.max_intra_op_parallelism == 1 and tuned.prefetch == AUTOTUNE


def test_unknown_preset_lists_the_presets():
    with pytest.raises(UsageError) as error:
        get_preset("fast")
    message = str(error.value)
    assert "\n" not in message and "'fast'" in message and "seed, autotune, tuned" in message


def test_single_knobs_override_a_preset():
    config = resolve_pipeline("seed", {"map_parallelism": 4, "prefetch": AUTOTUNE, "batch_size": None})
    assert config.preset == "seed" and config.map_parallelism == 4 and config.prefetch == AUTOTUNE
    assert config.batch_size == 32  # None means "flag not given"
    assert overridden_fields(config) == {"map_parallelism": 4, "prefetch": AUTOTUNE}
    assert resolve_pipeline("tuned", {"prefetch": OFF}).prefetch is None


def test_unknown_override_is_named():
    with pytest.raises(UsageError, match="unknown knob.*map_paralelism"):
        resolve_pipeline("seed", {"map_paralelism": 4})


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"map_parallelism": 0}, "map_parallelism: expected a positive integer or 'autotune' or none, got 0"),
        ({"batch_size": -3}, "batch_size: expected a positive integer, got -3"),
        ({"cache": "disk"}, "cache: expected one of none, memory, file, got 'disk'"),
        ({"cache": "file"}, "cache_path"),
        ({"shuffle_at": "later"}, "shuffle_at: expected one of decoded, encoded, got 'later'"),
        ({"decode": "fast"}, "decode: expected one of full, crop, scaled"),
        ({"deterministic": "yes"}, "deterministic: expected true or false, got 'yes'"),
        ({"shuffle_buffer": 1.5}, "shuffle_buffer: expected an integer, got 1.5"),
        ({"map_parallelization": "on"}, "map_parallelization: expected true, false or none"),
    ],
)
def test_bad_knob_values_are_one_line_usage_errors(changes, names):
    with pytest.raises(UsageError) as error:
        resolve_pipeline("tuned", changes)
    assert names in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_config_save_load_round_trip(tmp_path, name):
    config = PRESETS[name].replace(cache="file", cache_path=str(tmp_path / "c"), map_parallelism=3)
    path = tmp_path / "pipeline.json"
    config.save(path)
    assert PipelineConfig.load(path) == config
    wrapped = tmp_path / "fixed.json"
    wrapped.write_text(json.dumps({"pipeline": config.to_dict(), "note": "from diagnose --fix"}))
    assert PipelineConfig.load(wrapped) == config


def test_loading_a_config_with_an_unknown_key_names_it(tmp_path):
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps({"batch_size": 8, "turbo": True}))
    with pytest.raises(UsageError, match="unknown key.*turbo"):
        PipelineConfig.load(path)


def _source(kind, first):
    from stallscope.pipeline.sources import DataSource

    return DataSource(kind=kind, path=first.parent, split="train", labels=("a",), files=(first,),
                      file_labels=(0,) if kind == "files" else (), schema="", num_examples=1, total_bytes=1)


NO_QUOTA = CpuLimits(cpus=(0, 1))


def test_tuned_keeps_more_reads_in_flight_only_on_jpegs_in_a_store(monkeypatch):
    from functools import partial
    from pathlib import Path

    from stallscope.pipeline import presets
    from stallscope.pipeline.presets import REMOTE_READS_IN_FLIGHT, POOLED_READS_IN_FLIGHT
    from stallscope.storage import gcs_obstore
    from stallscope.storage.s3_request_plan import groups_in_flight
    from stallscope.storage.location import as_path

    source = _source
    tuned_for_source = partial(presets.tuned_for_source, limits=NO_QUOTA)  # the same on any machine
    tuned = PRESETS["tuned"]
    assert tuned.gcs_reader == "pooled" and PRESETS["seed"].gcs_reader == "tf"
    monkeypatch.setattr(gcs_obstore, "available", lambda: True)
    on_gs = tuned_for_source(tuned, source("files", as_path("gs://bucket/train/a/1.jpg")))
    assert on_gs.read_parallelism == POOLED_READS_IN_FLIGHT and on_gs.gcs_reader == "pooled"
    assert overridden_fields(on_gs).keys() == {"read_parallelism", "private_threadpool_size"}
    on_s3 = tuned_for_source(tuned, source("files", as_path("s3://bucket/train/a/1.jpg")))
    assert on_s3.read_parallelism == POOLED_READS_IN_FLIGHT and groups_in_flight(POOLED_READS_IN_FLIGHT) == 8
    assert on_s3.private_threadpool_size > 8  # a thread per group waiting, and a thread per core to decode
    on_tf_gs = tuned_for_source(tuned.replace(gcs_reader="tf"), source("files", as_path("gs://b/t/a/1.jpg")))
    assert on_tf_gs.read_parallelism == REMOTE_READS_IN_FLIGHT  # TF's client: a thread per request in flight
    assert on_tf_gs.private_threadpool_size > REMOTE_READS_IN_FLIGHT  # the reads and a thread per core to decode
    unchanged = [
        (tuned, source("files", Path("/data/train/a/1.jpg"))),                       # local disk
        (tuned, source("records", as_path("s3://bucket/records/train-0.tfrecord"))),  # a request per 16 MB
        (tuned, source("records", as_path("gs://bucket/records/train-0.tfrecord"))),
        (PRESETS["seed"], source("files", as_path("gs://bucket/train/a/1.jpg"))),    # seed stays as the seeds wrote it
        (tuned.replace(private_threadpool_size=4), source("files", as_path("gs://b/t/a/1.jpg"))),  # the user's own
        (tuned.replace(read_parallelism=8), source("files", as_path("gs://b/t/a/1.jpg"))),
    ]
    for config, src in unchanged:
        assert tuned_for_source(config, src) is config
    # Without obstore, tuned reads gs:// through TF's own client, with TF's reads in flight.
    monkeypatch.setattr(gcs_obstore, "available", lambda: False)
    fallback = tuned_for_source(tuned, source("files", as_path("gs://bucket/train/a/1.jpg")))
    assert fallback.gcs_reader == "tf" and fallback.read_parallelism == REMOTE_READS_IN_FLIGHT
    assert tuned_for_source(tuned, source("records", as_path("gs://b/r/0.tfrecord"))).gcs_reader == "tf"


def test_tuned_under_a_cpu_quota_gets_a_pool_of_the_quotas_cores():
    """TF sizes its shared pool by the CPUs; under a smaller quota that many threads spend most of
    each period held back."""
    from pathlib import Path

    from stallscope.pipeline.presets import tuned_for_source
    from stallscope.storage.location import as_path
    from stallscope.storage.s3_request_plan import groups_in_flight

    tuned = PRESETS["tuned"]
    local = _source("files", Path("/data/train/a/1.jpg"))
    pod = CpuLimits(cpus=tuple(range(64)), quota_cores=1.5)  # a 1.5-CPU limit on a 64-core node
    assert tuned_for_source(tuned, local, pod).private_threadpool_size == 2
    assert tuned_for_source(tuned, _source("records", Path("/data/r/train-0.tfrecord")), pod).private_threadpool_size == 2
    on_s3 = tuned_for_source(tuned, _source("files", as_path("s3://b/train/a/1.jpg")), pod)
    assert on_s3.private_threadpool_size == groups_in_flight(on_s3.read_parallelism) + 2  # the groups' threads, then the quota's
    unchanged = [
        (tuned, NO_QUOTA),                                                  # no quota: TF's pool fits the CPUs
        (tuned, CpuLimits(cpus=(0, 1), quota_cores=2.0)),                   # a quota of every CPU
        (tuned, CpuLimits(cpus=(0, 1), quota_cores=1.5)),                   # rounds up to every CPU
        (tuned.replace(private_threadpool_size=8), pod),                    # the user's own pool
        (PRESETS["seed"], pod),                                             # seed stays as the seeds wrote it
    ]
    for config, limits in unchanged:
        assert tuned_for_source(config, local, limits) is config
