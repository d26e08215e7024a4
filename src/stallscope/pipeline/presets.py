"""Named pipelines: what the seeds wrote, what the tf.data guide advises, and our measured best.

`--pipeline NAME` picks one; single knob flags override its fields (`resolve_pipeline`).
"""

from __future__ import annotations

import dataclasses
import math
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


def tuned_for_store(config: PipelineConfig, kind: str, scheme: str, limits: "CpuLimits | None" = None,
                    round_trip_ms: float | None = None) -> PipelineConfig:
    """`tuned` as it reads `kind` ("files", "records") from a store (`scheme`: "gs", "s3", "file", or
    NETWORK_FS for a network file system), on the CPU this process may use (`limits`, else as it
    stands now). `round_trip_ms`: one file's open and first read there, measured (network file system).

    On a network file system every open and read waits a round trip, as a request to a bucket does:
    files get a read map of their own with `network_fs_reads_in_flight` calls (the round trip times the
    cores' decode rate) and records a parallel interleave over NETWORK_FS_SHARDS_IN_FLIGHT shards, each
    on a private pool of those threads plus the cores (the mount at 30 ms: 8 reads on 10 threads gave
    119 images/s against 30 on the shared pool; records 339 against 95).

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
    from stallscope.storage import gcs_obstore

    if config.preset != "tuned":
        return config
    if scheme == "gs" and config.gcs_reader == "pooled" and (config.data_service or not gcs_obstore.available()):
        config = config.replace(gcs_reader="tf")  # a tf.data service's workers run TF's reader, not ours
    limits = limits if limits is not None else current()
    return pool_for_quota(_reads_in_flight(config, kind, scheme, limits.whole_cores, round_trip_ms), limits)


def _reads_in_flight(config: PipelineConfig, kind: str, scheme: str, cores: int,
                     round_trip_ms: float | None = None) -> PipelineConfig:
    """Data in a bucket or on a network file system: its reads in flight and the private pool they
    wait on (`tuned_for_store`)."""
    from stallscope.storage.s3_request_plan import groups_in_flight

    if config.private_threadpool_size or config.read_parallelism != AUTOTUNE:
        return config
    if scheme == NETWORK_FS:
        reads = network_fs_reads_in_flight(kind, round_trip_ms, cores)
        return config.replace(read_parallelism=reads, private_threadpool_size=reads + cores)
    if kind != "files" or scheme not in ("gs", "s3"):
        return config
    if scheme == "s3" or config.gcs_reader == "pooled":
        return config.replace(read_parallelism=POOLED_READS_IN_FLIGHT,
                              private_threadpool_size=groups_in_flight(POOLED_READS_IN_FLIGHT) + cores)
    return config.replace(read_parallelism=REMOTE_READS_IN_FLIGHT,
                          private_threadpool_size=REMOTE_READS_IN_FLIGHT + cores)


# A network file system (NFS, SMB, a FUSE mount): "scheme" of its paths for `tuned_for_store`.
NETWORK_FS = "network-fs"
# Images per second one core decodes at ImageNet sizes (the high end measured here: 800-1,700 images/s
# on 2 cores): with the storage's round trip per image, Little's law gives the reads in flight that
# keep every core decoding.
DECODE_IMAGES_PER_S_PER_CORE = 850.0
NETWORK_FS_MOST_IN_FLIGHT = 64
# Without a measured round trip (a what-if, a tf.data service): what 20 ms per file needs on 2 cores.
NETWORK_FS_READS_IN_FLIGHT = 32
# Records: each shard is read one block at a time by one interleave thread; a few shards at once
# cover the round trips (the mount at 30 ms: 5 shards at once gave 339 images/s against 95).
NETWORK_FS_SHARDS_IN_FLIGHT = 8


def network_fs_reads_in_flight(kind: str, round_trip_ms: float | None, cores: int) -> int:
    """Reads in flight on a network file system: for files, the round trip of one file's open and
    first read (measured, `storage.under.time_file_round_trips`) times the images/s the cores decode,
    at least a thread per core and at most NETWORK_FS_MOST_IN_FLIGHT; for records, shards at once."""
    if kind != "files":
        return NETWORK_FS_SHARDS_IN_FLIGHT
    if round_trip_ms is None or not math.isfinite(round_trip_ms):
        return NETWORK_FS_READS_IN_FLIGHT
    needed = math.ceil(round_trip_ms / 1000.0 * DECODE_IMAGES_PER_S_PER_CORE * max(1, cores))
    return max(max(1, cores), min(NETWORK_FS_MOST_IN_FLIGHT, needed))


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


def tuned_for_source(config: PipelineConfig, source: "DataSource", limits: "CpuLimits | None" = None,
                     round_trip_ms: float | None = None) -> PipelineConfig:
    """`tuned_for_store` for the store `source` lives in. On a network file system the open and read
    round trip is timed here (a few files, one at a time, at most a few seconds) unless the caller
    measured it (`round_trip_ms`)."""
    from stallscope.storage.location import RemotePath, as_path

    if config.preset != "tuned" or not source.files:
        return tuned_for_store(config, source.kind, "file", limits)
    first = as_path(source.files[0])  # a files source holds its images as text
    if isinstance(first, RemotePath):
        return tuned_for_store(config, source.kind, first.scheme, limits)
    from stallscope.storage.under import storage_under, time_file_round_trips

    if not storage_under(first).remote:
        return tuned_for_store(config, source.kind, "file", limits)
    if round_trip_ms is None and source.kind == "files" and not config.private_threadpool_size \
            and config.read_parallelism == AUTOTUNE:
        round_trip_ms = time_file_round_trips([str(f) for f in source.files]).open_and_read_ms
    return tuned_for_store(config, source.kind, NETWORK_FS, limits, round_trip_ms)


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
