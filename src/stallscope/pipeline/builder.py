"""`build_dataset`: a `PipelineConfig` plus a `DataSource` -> the `tf.data.Dataset` a model trains on.

The chain, with every stage optional except read, decode and batch:

    files:   paths -> [shuffle files] -> [read map with read_parallelism, only when that differs
             from map_parallelism; otherwise the read runs inside the decode map]
    records: shards -> [shuffle shards] -> TFRecordDataset (or parallel interleave over shards);
             shards in a store: [shuffle shards] -> [repeat] -> (shard, the one its slot reads next)
             -> stallscope's reader, flat_map or parallel interleave
    then:    [cache encoded] -> [shuffle encoded, whole] -> [repeat, early] -> [shuffle encoded,
             window] -> decode map (parse, decode, resize, normalise, label) -> [cache decoded]
             -> [shuffle decoded] -> [repeat, late] -> batch -> [tf.data service] -> [prefetch]

`repeat=True` (training by steps) repeats as early as the config allows: before the decode map, so
epoch ends cause no drain-and-refill of the parallel map. The shuffle of encoded records is capped at
the data set's size (a larger buffer adds memory, not randomness). When the whole data set fits, it
shuffles each epoch in full before the repeat, so epochs stay whole (as a full shuffle of file names
does); otherwise it is a window over the repeated stream, mixing across an epoch boundary within one
buffer, the tf.data guide's repeat-before-shuffle, with no refill of a large buffer each epoch. A
shuffle or cache of decoded images needs whole epochs after the decode, so then the repeat comes late.

Elements are (images float32 [B, S, S, 3], labels) with one-hot float32 [B, num_classes] labels (or
int32 [B]); a label outside [0, num_classes) fails the iterator with the file or record named.
TF's static rewrites and threading knobs are set through `tf.data.Options` (see `dataset_options`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import tensorflow as tf

from stallscope.errors import UsageError
from stallscope.pipeline import stages
from stallscope.pipeline.config import STATIC_OPTIMIZATIONS, PipelineConfig
from stallscope.pipeline.sources import DataSource
from stallscope.records.schema import get_schema
from stallscope.storage import tfdata_readers

logger = logging.getLogger(__name__)

# Where `extra_stages` hooks go: after reading (elements: encoded bytes, label, name), after the
# decode map (image, label), after batching (images, labels).
HOOK_POINTS = ("after_read", "after_decode", "after_batch")
Hook = Callable[[tf.data.Dataset], tf.data.Dataset]


def _calls(value: int | None):
    """A config parallelism knob as `num_parallel_calls` (AUTOTUNE is -1 in both)."""
    return None if value is None else int(value)


def dataset_options(config: PipelineConfig) -> tf.data.Options:
    """tf.data.Options for the config: order, autotune, threading and TF's static rewrites."""
    options = tf.data.Options()
    options.deterministic = config.deterministic
    options.autotune.enabled = config.autotune
    if config.private_threadpool_size:
        options.threading.private_threadpool_size = config.private_threadpool_size
    if config.max_intra_op_parallelism:
        options.threading.max_intra_op_parallelism = config.max_intra_op_parallelism
    for name in STATIC_OPTIMIZATIONS:
        value = getattr(config, name)
        if value is not None:
            setattr(options.experimental_optimization, name, value)
    return options


def build_dataset(
    config: PipelineConfig,
    source: DataSource,
    *,
    repeat: bool = False,
    num_classes: int | None = None,
    one_hot: bool = True,
    shuffle_files_seed: int | None = None,
    extra_stages: Mapping[str, Hook] | None = None,
    skip_examples: int = 0,
) -> tf.data.Dataset:
    """The input pipeline of `config` over `source` (see the module docstring for the chain).

    num_classes: one-hot depth and label bound (default: the source's label count).
    shuffle_files_seed: seed of the file/shard shuffle (default: config.seed).
    extra_stages: {hook point: function(dataset) -> dataset}, for tests and diagnosis probes
        (e.g. a stage that sleeps per element to emulate slow storage); points are HOOK_POINTS.
    skip_examples: examples dropped just before the decode map, so a resumed run continues where it
        stopped without decoding what it skips; only where `unresumable_reason(config)` is None.
    """
    hooks = dict(extra_stages or {})
    unknown = sorted(set(hooks) - set(HOOK_POINTS))
    if unknown:
        raise UsageError(f"extra_stages: unknown hook point(s) {', '.join(unknown)}; allowed: {', '.join(HOOK_POINTS)}")
    tfdata_readers.require_reader(source.files, config.gcs_reader, config.data_service)
    num_classes = source.num_classes if num_classes is None else num_classes
    if num_classes <= 0:
        raise UsageError(f"num_classes: expected a positive integer, got {num_classes!r}")
    if config.batch_size > source.num_examples and config.drop_remainder and not repeat:
        logger.warning(
            "batch size %d exceeds the %d examples of %s and drop_remainder is on: no batch at all",
            config.batch_size, source.num_examples, source.path,
        )
    file_seed = config.seed if shuffle_files_seed is None else shuffle_files_seed
    config = _shuffle_after_decoded_cache(config)
    cache_encoded = config.cache != "none" and config.cache_at == "encoded"
    # A separate read stage only where something sits between read and decode; otherwise the read
    # (files) or parse (records) runs inside the decode map, as the seeds wrote it.
    separate_read = cache_encoded or "after_read" in hooks

    repeat_early = repeat and not _epochs_after_decode(config)
    # Shards streamed from a store repeat as their list, before the read; nothing between read and
    # repeat may need an epoch's end (a cache of encoded records, a hook on the read).
    repeat_shards = (repeat_early and source.kind == "records" and not separate_read
                     and tfdata_readers.needs_own_reader(source.files, config.gcs_reader))
    if source.kind == "files":
        dataset, element = _read_files(config, source, file_seed, separate_read)
    else:
        dataset, element = _read_records(config, source, file_seed, repeat_shards)
    dataset = hooks.get("after_read", _same)(dataset)

    if cache_encoded:
        dataset = _cache(dataset, config)
    shuffle_encoded = bool(config.shuffle_buffer) and config.shuffle_at == "encoded" and not _shuffled_paths(config, source)
    # A buffer beyond the data set adds no randomness, only memory (and, repeated, epochs mixed together).
    buffer = min(config.shuffle_buffer, source.num_examples)
    shuffle_window = shuffle_encoded and repeat_early and (buffer < source.num_examples or repeat_shards)
    if shuffle_encoded and not shuffle_window:
        dataset = dataset.shuffle(buffer, seed=config.seed)  # every epoch a full permutation
    if repeat_early and not repeat_shards:
        dataset = dataset.repeat()
    if shuffle_window:
        dataset = dataset.shuffle(buffer, seed=config.seed)  # a window over the stream; no refill each epoch

    if skip_examples:
        why = unresumable_reason(config)
        if why:
            raise UsageError(f"skip_examples: this pipeline cannot skip before decoding: {why}")
        dataset = dataset.skip(skip_examples)
    if element == "remote path":
        dataset, element = _fetch_grouped(dataset, config), "encoded"
    dataset = dataset.map(
        _decode_fn(config, source, element, num_classes, one_hot),
        num_parallel_calls=_calls(config.map_parallelism),
        deterministic=None if config.map_parallelism is None else config.deterministic,
        name="decode",
    )
    dataset = hooks.get("after_decode", _same)(dataset)

    if config.cache != "none" and config.cache_at == "decoded":
        dataset = _cache(dataset, config)
    if config.shuffle_buffer and config.shuffle_at == "decoded":
        dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed)
    if repeat and not repeat_early:
        dataset = dataset.repeat()
    dataset = dataset.batch(config.batch_size, drop_remainder=config.drop_remainder)
    dataset = hooks.get("after_batch", _same)(dataset)
    if config.data_service:
        from stallscope.service.servers import distribute

        dataset = distribute(dataset.with_options(dataset_options(config)), config.data_service)
    if config.prefetch is not None:
        dataset = dataset.prefetch(config.prefetch)
    return dataset.with_options(dataset_options(config))


def _shuffle_after_decoded_cache(config: PipelineConfig) -> PipelineConfig:
    """A cache replays its first epoch in the same order, so a shuffle before a cache of decoded
    images would shuffle only once; the shuffle moves after the cache (and says so)."""
    if config.cache == "none" or config.cache_at != "decoded" or not config.shuffle_buffer:
        return config
    if config.shuffle_at == "encoded":
        logger.warning(
            "shuffle_at='encoded' with cache_at='decoded': the cache would replay one order every epoch; "
            "shuffling the cached decoded images instead (buffer %d)", config.shuffle_buffer,
        )
        return config.replace(shuffle_at="decoded")
    return config


def unresumable_reason(config: PipelineConfig) -> str | None:
    """None when the order of examples is a pure function of the config (its seed) and is settled
    before the decode map, so a fresh pipeline can skip, cheaply, to where an earlier one stopped;
    otherwise why not."""
    if _epochs_after_decode(config):
        return "a shuffle or cache of decoded images decides the order"
    if not config.deterministic:
        return "its order is not deterministic"
    if config.data_service:
        return "the tf.data service hands out the data"
    return None


def _epochs_after_decode(config: PipelineConfig) -> bool:
    """A decoded-image shuffle or cache works in whole epochs, so the repeat must follow it."""
    decoded_shuffle = bool(config.shuffle_buffer) and config.shuffle_at == "decoded"
    decoded_cache = config.cache != "none" and config.cache_at == "decoded"
    return decoded_shuffle or decoded_cache


def _same(dataset):
    return dataset


def _shuffled_paths(config: PipelineConfig, source: DataSource) -> bool:
    """Files source, encoded shuffle, no encoded cache: shuffling the path list is the cheap form."""
    return source.kind == "files" and not (config.cache != "none" and config.cache_at == "encoded")


def _read_files(config: PipelineConfig, source: DataSource, file_seed: int, separate_read: bool):
    """(dataset, element kind): "path" elements (path, label, path), "encoded" (bytes, label, path) or
    "remote path" (path, label: stallscope's reader fetches them later)."""
    # As bytes, the name the file system spells (a name that is not UTF-8 is no error), and tensors
    # made here: from_tensor_slices turns a list into a fixed-width numpy array first (1.5 s against
    # 0.25 s for ImageNet's 1.28 million paths).
    paths = [os.fsencode(str(p)) for p in source.files]
    dataset = tf.data.Dataset.from_tensor_slices((tf.constant(paths, dtype=tf.string),
                                                  tf.constant(source.file_labels, dtype=tf.int32)))
    if config.shuffle_files:
        dataset = dataset.shuffle(len(paths), seed=file_seed, reshuffle_each_iteration=True)
    elif config.shuffle_buffer and config.shuffle_at == "encoded" and _shuffled_paths(config, source):
        dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed)
    if config.interleave_cycle_length is not None:
        logger.warning(
            "interleave_cycle_length=%s does not apply to a files source (it reads with a map); ignored",
            config.interleave_cycle_length,
        )
    if tfdata_readers.needs_own_reader(source.files, config.gcs_reader):
        # s3:// (TF cannot open it) and pooled gs://: our reader fetches groups of files (`_fetch_grouped`),
        # here when something sits between read and decode, else just before the decode map, after any
        # skip of a resumed run.
        return (_fetch_grouped(dataset, config), "encoded") if separate_read else (dataset, "remote path")
    if config.read_parallelism in (None, config.map_parallelism) and not separate_read:
        # Read inside the decode map, with its parallelism: one stage less per image (measured
        # ~0.08 ms of CPU per image less than a separate read map of the same parallelism).
        return dataset, "path"
    # A separate read stage: a map, parallel when read_parallelism is set (measured cheaper per
    # image than an interleave of one-file datasets, with the same number of reads in flight).
    dataset = dataset.map(
        lambda path, label: (tf.io.read_file(path), label, path),
        num_parallel_calls=_calls(config.read_parallelism),
        deterministic=None if config.read_parallelism is None else config.deterministic,
        name="read",
    )
    return dataset, "encoded"


def _fetch_grouped(dataset: tf.data.Dataset, config: PipelineConfig) -> tf.data.Dataset:
    """(path, label) -> (bytes, label, path) through stallscope's reader of the store, as many requests
    at once as the read's (or else the map's) parallelism asks."""
    parallelism = config.read_parallelism if config.read_parallelism is not None else config.map_parallelism
    return tfdata_readers.fetch_files(dataset, requests=tfdata_readers.in_flight(parallelism), deterministic=config.deterministic)


def build_record_reads(config: PipelineConfig, source: DataSource) -> tf.data.Dataset:
    """The serialized records of `source` read by one stream, as `config` reads them one shard at a
    time, repeated: the read chain alone, without the decode, which a diagnosis times to know what a
    parallel decode behind a sequential reader can gain."""
    if source.kind != "records":
        raise UsageError(f"source: expected records for a read stage alone, got {source.kind!r}")
    one_stream = config.replace(read_parallelism=None, interleave_cycle_length=None, shuffle_files=False)
    dataset, _ = _read_records(one_stream, source, one_stream.seed)
    return dataset.repeat()


def _read_records(config: PipelineConfig, source: DataSource, file_seed: int, repeat_shards: bool = False):
    """(dataset of serialized records, "serialized"). `repeat_shards`: repeat the list of shards that
    stallscope's reader streams from a store (where the pipeline repeats before decoding anyway), so
    each epoch's first shards are known while the last ones are read (`tfdata_readers.with_following`)."""
    shards = [str(p) for p in source.files]
    own_reader = tfdata_readers.needs_own_reader(source.files, config.gcs_reader)  # records streamed by our reader
    files = None
    if config.shuffle_files:
        files = tf.data.Dataset.from_tensor_slices(shards).shuffle(len(shards), seed=file_seed)
    sequential = config.read_parallelism is None and config.interleave_cycle_length is None
    if not own_reader and sequential:
        return tf.data.TFRecordDataset(files if files is not None else shards, name="read"), "serialized"
    files = files if files is not None else tf.data.Dataset.from_tensor_slices(shards)
    cycle_length = None if sequential else _cycle_length(config)
    calls = _calls(config.read_parallelism)
    if own_reader:
        if not sequential:
            # A repeated list would let more slots than shards open the next epoch's copies at once (16
            # reads in flight over 8 shards: 16 first blocks before the first record, not 8); a list
            # read once leaves the extra slots empty anyway.
            cycle_length = min(_slots(cycle_length), len(shards))
            calls = min(calls, cycle_length) if calls is not None and calls > 0 else calls
        files = tfdata_readers.with_following(files.repeat() if repeat_shards else files,
                                       1 if sequential else cycle_length)
        if sequential:
            return files.flat_map(tfdata_readers.shard_records, name="read"), "serialized"
    dataset = files.interleave(
        tfdata_readers.shard_records if own_reader else (lambda shard: tf.data.TFRecordDataset(shard)),
        cycle_length=cycle_length,
        block_length=1,
        num_parallel_calls=calls,
        deterministic=None if config.read_parallelism is None else config.deterministic,
        name="read",
    )
    return dataset, "serialized"


def _slots(cycle_length: int) -> int:
    """The shards an interleave of this cycle length reads at once: TF gives AUTOTUNE one per CPU this
    process may run on (its affinity; not its CPU quota, which TF does not read)."""
    from stallscope.cpu_limits import current

    return cycle_length if cycle_length > 0 else max(1, len(current().cpus))


def _cycle_length(config: PipelineConfig) -> int:
    """The interleave's cycle length; only called when one of the two knobs is set."""
    if config.interleave_cycle_length is not None:
        return int(config.interleave_cycle_length)
    return int(config.read_parallelism)


def _cache(dataset: tf.data.Dataset, config: PipelineConfig) -> tf.data.Dataset:
    if config.cache == "file":
        # TF writes PATH.index, PATH.data-* and a lock file beside PATH but makes no folder: a missing
        # one would surface at the first batch as a NotFoundError traceback.
        folder = Path(config.cache_path).parent
        if not folder.is_dir():
            raise UsageError(f"--cache-path: expected a file name in an existing folder, got {config.cache_path!r} "
                             f"({str(folder)!r} {'is a file' if folder.exists() else 'does not exist'})")
        lock = Path(f"{config.cache_path}_0.lockfile")  # left by a run that is writing the cache, or was killed
        if lock.exists():
            raise UsageError(f"--cache-path: expected a cache no other run is writing, got {config.cache_path!r} "
                             f"({str(lock)!r} is there; remove it if no other run uses this cache)")
    return dataset.cache(config.cache_path if config.cache == "file" else "")


def _decode_fn(config: PipelineConfig, source: DataSource, element: str, num_classes: int, one_hot: bool):
    """The decode map: (path|bytes, label, name) or a serialized record -> (image, label)."""
    decode = stages.decoder(config.decode, config.image_size)
    normalize = stages.normalizer(config.normalize)

    def finish(encoded, label, where):
        image = normalize(stages.resize(decode(encoded), config.image_size))
        label = stages.checked_label(label, num_classes, where)
        return image, (stages.one_hot(label, num_classes) if one_hot else label)

    if element == "serialized":
        parse = stages.parse_record(get_schema(source.schema))
        return lambda serialized: finish(*parse(serialized))
    if element == "path":
        return lambda path, label: finish(tf.io.read_file(path), label, path)
    return finish


def build_decode_limit_dataset(
    encoded_images: list[bytes], *, image_size: int, decode: str = "full", parallelism: int = tf.data.AUTOTUNE,
    batch_size: int = 32,
) -> tf.data.Dataset:
    """Decode + resize alone over in-memory bytes on all cores: the CPU ceiling of any pipeline.

    No reading, parsing, shuffling or labels; one element of the result is a batch of images.
    Repeats forever so a benchmark can time as many batches as it likes.
    """
    decode_fn = stages.decoder(decode, image_size)
    dataset = tf.data.Dataset.from_tensor_slices(encoded_images).repeat()
    dataset = dataset.map(
        lambda encoded: stages.resize(decode_fn(encoded), image_size),
        num_parallel_calls=parallelism, deterministic=False,
    )
    return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
