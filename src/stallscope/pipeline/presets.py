"""Named pipelines: what the seeds wrote, what the tf.data guide advises, and our measured best.

`--pipeline NAME` picks one; single knob flags override its fields (`resolve_pipeline`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from stallscope.config import AUTOTUNE
from stallscope.errors import UsageError
from stallscope.pipeline.config import STATIC_OPTIMIZATIONS, PipelineConfig

if TYPE_CHECKING:
    from stallscope.cpu_limits import CpuLimits
    from stallscope.pipeline.sources import DataSource

# Every TF rewrite off: TF 2.21 otherwise turns the seeds' sequential map into a parallel, prefetched
# one (map_parallelization, inject_prefetch, map_and_batch_fusion, parallel_batch).
_REWRITES_OFF = {name: False for name in STATIC_OPTIMIZATIONS}

SEED = PipelineConfig(
    # seed-002: TFRecordDataset(files).map(parse_decode_resize_scale).shuffle(10240).batch(32)
    preset="seed",
    batch_size=32,
    image_size=224,
    shuffle_buffer=10240,
    shuffle_at="decoded",
    shuffle_files=False,
    read_parallelism=None,
    map_parallelism=None,
    prefetch=None,
    deterministic=True,
    normalize="minus_one_one",
    drop_remainder=False,  # the seeds' batch(32) keeps the last partial batch
    **_REWRITES_OFF,
)

AUTOTUNE_PRESET = PipelineConfig(
    # The tf.data performance guide applied to the seed pipeline: parallel interleave over the
    # files/shards, parallel map and prefetch, all AUTOTUNE; TF's rewrites at their defaults.
    preset="autotune",
    batch_size=32,
    image_size=224,
    shuffle_buffer=10240,
    shuffle_at="decoded",
    read_parallelism=AUTOTUNE,
    map_parallelism=AUTOTUNE,
    prefetch=AUTOTUNE,
    deterministic=True,
)

TUNED = PipelineConfig(
    # Our best measured on 2 cores (benchmarks/pipeline.py): shards read in
    # parallel (files: read inside the decode map, which is as parallel), the shuffle moved before
    # decode (file names / encoded records, not decoded images), every core decoding, one intra-op
    # thread per element (no oversubscription of 2 cores by resize), batches prefetched. Decode
    # tricks stay off: they change pixels, and at ImageNet sizes (short side ~375) a scaled decode
    # for 224 cannot scale at all. The [-1, 1] scaling moves to the device: batches leave the
    # pipeline in 0..255 and the model's first layer (InputAdapter) scales them, so the same values
    # reach the base while the host CPU saves a pass over every pixel.
    preset="tuned",
    batch_size=32,
    image_size=224,
    shuffle_buffer=10240,
    shuffle_at="encoded",
    shuffle_files=True,
    read_parallelism=AUTOTUNE,
    map_parallelism=AUTOTUNE,
    prefetch=AUTOTUNE,
    # Deterministic order: in TF 2.21 letting elements overtake cost ~0.05 ms of CPU per image
    # and ~4% throughput here, in every round measured.
    deterministic=True,
    max_intra_op_parallelism=1,
    normalize="none",
    # gs:// over kept-alive connections where obstore is installed (`tuned_for_store` falls back to TF's).
    gcs_reader="pooled",
)

PRESETS: dict[str, PipelineConfig] = {p.preset: p for p in (SEED, AUTOTUNE_PRESET, TUNED)}


def get_preset(name: str) -> PipelineConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"--pipeline: unknown preset {name!r}; expected one of {', '.join(PRESETS)}") from None


# `tuned` on JPEG files in gs:// through TF's own client: reads in flight (see tuned_for_source).
# Latency x throughput: a JPEG through TF's gs:// waits ~3 round trips (a new TLS connection per
# request), ~33 ms at 10 ms each; 32 in flight keep ~1,000 images/s fed.
REMOTE_READS_IN_FLIGHT = 32
# `tuned` on JPEG files through the pooled reader (s3://, and gs:// with gcs_reader "pooled"): its
# requests wait on request threads outside the GIL, in groups of 16 per tf.data call, so more can be
# in flight at little cost; the groups hold tf.data threads.
POOLED_READS_IN_FLIGHT = 128


def tuned_for_store(config: PipelineConfig, kind: str, scheme: str, limits: "CpuLimits | None" = None) -> PipelineConfig:
    """`tuned` as it reads `kind` ("files", "records") from a store (`scheme`: "gs", "s3", "file"),
    on the CPU this process may use (`limits`, else as it stands now).

    On gs:// `tuned` reads through the pooled reader (obstore) where it is installed, else (and on a
    tf.data service, whose workers cannot run a Python reader) through TF's own client. A JPEG
    through TF's gs:// is one request that waits its round trips, and tf.data's shared pool (a
    thread per core) keeps only about as many in flight as there are cores, so there the reads get a
    map of their own with REMOTE_READS_IN_FLIGHT calls on a private pool of that many
    threads plus the cores (`stallscope sweep` at 10 ms: 46 -> 164 images/s on 2 cores). Through the
    pooled reader JPEGs are fetched in groups of 16 requests, each group holding a tf.data thread
    while it waits: POOLED_READS_IN_FLIGHT (8 groups) on a private pool of the groups plus the cores
    (benchmarks/storage.py --store s3, ImageNet-like JPEGs at 10 ms on 2 cores: ~530 -> ~780
    images/s, against 2 groups on the shared pool, which left the decode waiting for threads). Left
    as it is where the user chose a private pool or a read parallelism, and for records (a request
    per large block). Anywhere else a CPU quota below the CPUs gets a pool of its own
    (`pool_for_quota`)."""
    from stallscope.cpu_limits import current
    from stallscope.storage import gcs_objects

    if config.preset != "tuned":
        return config
    if scheme == "gs" and config.gcs_reader == "pooled" and (config.data_service or not gcs_objects.available()):
        config = config.replace(gcs_reader="tf")  # a tf.data service's workers run TF's reader, not ours
    limits = limits if limits is not None else current()
    return pool_for_quota(_reads_in_flight(config, kind, scheme, limits.whole_cores), limits)


def _reads_in_flight(config: PipelineConfig, kind: str, scheme: str, cores: int) -> PipelineConfig:
    """JPEG files in a bucket: their reads in flight and the private pool they wait on (`tuned_for_store`)."""
    from stallscope.storage.s3_reading import groups_in_flight

    if kind != "files" or scheme not in ("gs", "s3") or config.private_threadpool_size \
            or config.read_parallelism != AUTOTUNE:
        return config
    if scheme == "s3" or config.gcs_reader == "pooled":
        return config.replace(read_parallelism=POOLED_READS_IN_FLIGHT,
                              private_threadpool_size=groups_in_flight(POOLED_READS_IN_FLIGHT) + cores)
    return config.replace(read_parallelism=REMOTE_READS_IN_FLIGHT,
                          private_threadpool_size=REMOTE_READS_IN_FLIGHT + cores)


def pool_for_quota(config: PipelineConfig, limits: "CpuLimits") -> PipelineConfig:
    """A private pool of the quota's whole cores where a CPU quota (a container's or pod's CPU limit)
    is below the CPUs this process may run on and no pool is chosen: TF sizes its shared pool by the
    CPUs, so a pod limited to 2 CPUs on a 64-core node would decode 64 images at once and spend most
    of each quota period held back. Throughput stays the quota's; the steps stop stalling. In a real
    cgroup with 1 CPU's quota on 2 CPUs (`train --pipeline tuned`, README): steps of 29.8-31.0 ms at
    the 90th percentile against 62.7-67.4 with TF's pool of 2, and 0.07-0.13 s held back against
    4.3-4.5 s, at the same images/s. `diagnose` advises the same pool for any pipeline (advice.quota_pool)."""
    if config.private_threadpool_size or limits.whole_cores >= len(limits.cpus):  # no quota, or one of every CPU
        return config
    return config.replace(private_threadpool_size=limits.whole_cores)


def tuned_for_source(config: PipelineConfig, source: "DataSource", limits: "CpuLimits | None" = None) -> PipelineConfig:
    """`tuned_for_store` for the store `source` lives in."""
    from stallscope.storage.location import RemotePath, as_path

    first = as_path(source.files[0]) if source.files else None  # a files source holds its images as text
    return tuned_for_store(config, source.kind, first.scheme if isinstance(first, RemotePath) else "file", limits)


OFF = "off"  # an override value that switches a knob off (sets it to None), e.g. prefetch=OFF


def resolve_pipeline(preset: str, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """The preset with single knobs replaced; None values in `overrides` mean "not given".

    To switch an optional knob off (prefetch, map_parallelism, a static rewrite back to TF's
    default), pass OFF ("off"); it becomes None.

    The result keeps the preset's name, so reports say `seed` (with overrides listed by
    `overridden_fields`) rather than a bare custom config.
    """
    return apply_overrides(get_preset(preset), overrides)


def apply_overrides(base: PipelineConfig, overrides: dict[str, Any] | None) -> PipelineConfig:
    """`base` (a preset or a saved config) with single knobs replaced, as `resolve_pipeline` says."""
    changes = {k: (None if v == OFF else v) for k, v in (overrides or {}).items() if v is not None}
    known = {f.name for f in dataclasses.fields(PipelineConfig)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise UsageError(f"pipeline override: unknown knob(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    return base.replace(**changes)


def overridden_fields(config: PipelineConfig) -> dict[str, Any]:
    """Fields where `config` differs from the preset it names (empty for a custom config)."""
    base = PRESETS.get(config.preset)
    if base is None:
        return {}
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(PipelineConfig)
        if getattr(config, f.name) != getattr(base, f.name)
    }
