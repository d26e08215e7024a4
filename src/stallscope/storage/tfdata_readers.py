"""tf.data readers for data in a store TensorFlow cannot open itself (s3://) or reads one connection
per request (gs:// with `gcs_reader="pooled"`), and the one-line name of the reader a pipeline runs,
for the run record.

TensorFlow reads local files and gs:// natively (`tf.io.read_file`, `TFRecordDataset`). For s3:// the
pipeline fetches image files in groups of requests (one `tf.numpy_function` per group, the group
fetched concurrently by obstore's request threads, or on s3fs's event loop, so the requests in flight
do not each need one of tf.data's threads, of which it has as many as cores), and
TFRecord shards streamed in large blocks through the same reader, the next requested while one is
parsed, by a generator that checks every record's checksums and hands them to tf.data in groups.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import re

import numpy as np
import tensorflow as tf

from stallscope.errors import UsageError
from stallscope.storage.tfrecord_frames import FrameError, read_frames
from stallscope.storage import gcs_obstore, shard_heads
from stallscope.storage.gcs_store import gcs_block_note
from stallscope.storage.heap_padding import pad_heaps
from stallscope.storage.location import (
    RemotePath, S3Path, StorageError, as_path, backend, deadline, listed_size, no_answer, read_many,
)
from stallscope.storage.s3_request_plan import FIRST_BLOCK_BYTES, GROUP_REQUESTS, RECORDS_STAGE, SHARD_BLOCK_BYTES, groups_in_flight, in_flight, reader_name


def needs_own_reader(files, gcs_reader: str = "tf") -> bool:
    """True when these paths are read by stallscope's reader, not TensorFlow's: s3:// (TF cannot open
    it), and gs:// with `gcs_reader` "pooled"."""
    if not files:
        return False
    first = as_path(files[0])  # a files source holds its images as text
    return isinstance(first, S3Path) or (gcs_reader == "pooled" and isinstance(first, RemotePath)
                                         and first.scheme == "gs")


def require_reader(files, gcs_reader: str, data_service: str = "") -> None:
    """A one-line UsageError now, before the pipeline runs, where its reader is not installed or
    cannot run: stallscope's reader is a Python function, which a tf.data service's workers do not run."""
    if not needs_own_reader(files, gcs_reader):
        return
    on_s3 = isinstance(as_path(files[0]), S3Path)
    if data_service:
        store = "s3://" if on_s3 else "gs:// with --gcs-reader pooled"
        raise UsageError(f"--data-service: the service's workers cannot run stallscope's reader of {store} "
                         "(a Python function); expected data TF reads itself (a local or shared folder, or "
                         "gs:// with --gcs-reader tf)")
    if not on_s3:
        gcs_obstore.require_obstore()


def fetch_files(paths: tf.data.Dataset, *, requests: int, deterministic: bool | None) -> tf.data.Dataset:
    """(path, label) elements -> (bytes, label, path), fetched in groups of up to GROUP_REQUESTS, as
    many groups at once as `groups_in_flight(requests)` says (the next group is fetched while one is
    consumed when `requests` > 1). A group waiting on the store holds a tf.data thread: where several
    are in flight, a private pool of that many threads plus the cores keeps the decode running (the
    `tuned` preset sets one; see `tuned_for_store`)."""
    group = max(1, min(requests, GROUP_REQUESTS))
    groups = groups_in_flight(requests)

    def fetch(batch: np.ndarray) -> np.ndarray:
        data = read_many([as_path(p.decode()) for p in batch], group)
        return np.array(data, dtype=object)

    def fetch_group(path_batch, label_batch):
        data = tf.numpy_function(fetch, [path_batch], tf.string, stateful=False, name="s3_read")
        data.set_shape(path_batch.shape)
        return data, label_batch, path_batch

    grouped = paths.batch(group).map(
        fetch_group, num_parallel_calls=groups if groups > 1 else None,
        deterministic=deterministic if groups > 1 else None, name="read",
    )
    return grouped.unbatch()


# Records handed to tf.data per Python call. `from_generator` costs ~0.5 ms of CPU per element it
# yields (7.6 vs 1.0 ms per MiB of 75 KB records, one element per record or the bare generator), so a
# shard's records come out in groups and are unbatched in the graph.
GROUP_RECORDS = 256
GROUP_BYTES = 4 * 1024 * 1024
# A shard's first group is handed over sooner, once this much is in: a shard opened (at every epoch's
# start, in each interleave slot) is a wait the pipeline's buffers must cover.
FIRST_GROUP_BYTES = 256 * 1024


def _shard_groups(url: bytes, following_url: bytes = b""):
    """Yields the serialized records of one s3:// shard in groups, checking both checksums of every
    frame; the records before a bad frame still come out before its error, as from TFRecordDataset.
    `following_url`: the shard this reader's slot opens next ("" if none), whose first block is asked
    for once this one's last is in (`shard_heads`)."""
    path = as_path(url.decode())
    following = as_path(following_url.decode()) if following_url else None
    store = backend(path)
    group: list[bytes] = []
    size, group_bytes = 0, FIRST_GROUP_BYTES
    failure = None
    try:
        for payload in _frames(path, store, following):
            group.append(payload)
            size += len(payload)
            if len(group) >= GROUP_RECORDS or size >= group_bytes:
                yield group
                group, size, group_bytes = [], 0, GROUP_BYTES
    except (ValueError, StorageError) as exc:
        failure = exc
    except Exception as exc:  # botocore, aiohttp, OSError: the store failed mid-shard
        failure = store.error(path, exc)
    if group:
        yield group
    if failure is not None:
        raise failure


# Block requests of a shard in flight beyond the one being parsed: the next block's latency and
# transfer overlap the records of this one (s3fs's own read-ahead cache fetches only on demand).
BLOCKS_AHEAD = 1


def _block(path: RemotePath, request: concurrent.futures.Future) -> bytes:
    try:
        return request.result(timeout=deadline())
    except concurrent.futures.TimeoutError:
        raise no_answer(path, deadline()) from None


def block_spans(size: int) -> list[tuple[int, int]]:
    """[start, end) of a shard's blocks: FIRST_BLOCK_BYTES, then SHARD_BLOCK_BYTES each. A small first
    block gives a shard opened (at each epoch's start, in each interleave slot) its first records
    sooner. Tuned records at 10 ms (`storage serve --s3`, 24 MB shards): 0.93-0.95x of local disk,
    against 0.88-0.92x with 16 MB first blocks; a single stream reading such shards back to back
    (nothing to parse: benchmarks/s3_reader.py blocks) loses ~15%, as each shard costs one request more."""
    first = min(FIRST_BLOCK_BYTES, SHARD_BLOCK_BYTES)
    starts = [0, *range(first, size, SHARD_BLOCK_BYTES)] if size else []
    return [(start, min(end, size)) for start, end in zip(starts, [*starts[1:], size])]


def _first_span(size: int) -> tuple[int, int] | None:
    spans = block_spans(size)
    return spans[0] if spans else None


def _blocks(path: RemotePath, store, following: RemotePath | None = None):
    """The shard's bytes in blocks (`block_spans`), in order, with BLOCKS_AHEAD more requested (on the
    client's own threads or event loop) while each is consumed. The first block is asked for alone:
    asked for beside the next, it shares the link with bytes nobody waits for yet (1,600 75 KB
    records in 4 shards at 10 ms through a 1 Gbit/s cap, a training core of their own: 752-788
    images/s with the two asked for at once, 793-835 with the first alone; without the cap 1,087-1,105
    and 1,098-1,110). The size comes from the listing the run planned from where this process holds it
    (a round trip less per shard opened, at every epoch's start and in each interleave slot; shards are
    written whole under their final names, never changed in place), else from the store.

    The first block may already be on its way, asked for by the shard before in this slot; once this
    shard's last block is in, `following`'s first is asked for (`shard_heads`)."""
    size = listed_size(path)
    size = store.size(path) if size is None else size
    spans = iter(block_spans(size))
    pending: collections.deque = collections.deque()

    def last_in(block):
        if following is not None:
            shard_heads.ask(following, store, _first_span)
        return block

    try:
        first = next(spans, None)
        if first is None:
            return
        head = _block(path, shard_heads.take(path, store) or store.request_range(path, *first))
        pending.extend(store.request_range(path, start, end) for start, end in itertools.islice(spans, BLOCKS_AHEAD))
        yield head if pending else last_in(head)
        for start, end in spans:
            pending.append(store.request_range(path, start, end))
            yield _block(path, pending.popleft())
        while pending:
            block = _block(path, pending.popleft())
            yield block if pending else last_in(block)
    finally:  # the consumer stopped early (an error, a step limit): nothing left running for it
        for future in pending:
            future.cancel()


class _ByteStream:
    """Reads exact byte counts across a sequence of bytes-like blocks (obstore's buffers are read in
    place); copies only what a read takes."""

    def __init__(self, blocks) -> None:
        self._blocks = blocks
        self._block = memoryview(b"")
        self._pos = 0

    def read(self, count: int) -> bytes:
        """`count` bytes, or fewer only where the blocks end."""
        end = self._pos + count
        if end <= len(self._block):
            out = self._block[self._pos:end].tobytes()
            self._pos = end
            return out
        parts = [self._block[self._pos:]]
        need = count - len(parts[0])
        self._block, self._pos = memoryview(b""), 0
        while need > 0:
            block = next(self._blocks, None)
            if block is None:
                break
            block = memoryview(block)
            if len(block) > need:
                parts.append(block[:need])
                self._block, self._pos = block, need
                break
            parts.append(block)
            need -= len(block)
        return b"".join(parts)


# The reader's line for each break in a shard's framing (`tfrecord_frames.FrameError`).
_BROKEN_FRAME = {
    "truncated header": "{path}: truncated record header at byte {offset}",
    "length checksum": "{path}: corrupted record length at byte {offset}",
    "implausible length": "{path}: implausible record length {length} at byte {offset}",
    "truncated record": "{path}: truncated record at byte {offset}",
}


def _frames(path: RemotePath, store, following: RemotePath | None = None):
    """The records of a shard streamed from its store; a damaged one is a ValueError naming the byte."""
    stream = _ByteStream(_blocks(path, store, following))
    try:
        for frame in read_frames(stream.read):
            if not frame.data_crc_ok:
                raise ValueError(f"{path}: corrupted record at byte {frame.offset}")
            yield frame.payload
    except FrameError as exc:
        raise ValueError(_BROKEN_FRAME[exc.kind].format(path=path, offset=exc.offset, length=exc.length)) from None


def shard_records(shard, following="") -> tf.data.Dataset:
    """The records of one s3:// shard (a scalar string tensor), for an interleave; `following`: the
    shard the same slot reads next, "" if none (`with_following`). The process that streams them keeps
    freed memory at its heaps' tops (`heap_padding`)."""
    pad_heaps()
    groups = tf.data.Dataset.from_generator(
        _shard_groups, args=(shard, following), output_signature=tf.TensorSpec((None,), tf.string), name="s3_shard",
    )
    return groups.unbatch(name=RECORDS_STAGE)


def with_following(shards: tf.data.Dataset, slots: int) -> tf.data.Dataset:
    """(shard, following) for a dataset of shard names read `slots` at a time (an interleave's cycle
    length; 1 for a flat_map): `following` is the shard `slots` places on, which that slot opens when
    this one ends ("" past the end). Works on a shuffled or repeated list, whose order exists only in
    the graph; a static list takes `following_in_list` instead."""
    width = slots + 1

    def pair(names):
        padded = tf.concat([names, tf.fill([width], "")], 0)
        return padded[0], padded[slots]

    windows = shards.window(width, shift=1).flat_map(lambda names: names.batch(width))
    return windows.map(pair, name="following_shard")


def following_in_list(shards: list[str], slots: int) -> tf.data.Dataset:
    """`with_following` of a list known now: two name columns, so a pass's records are still counted
    from the shards it names (`dataset_passes`)."""
    return tf.data.Dataset.from_tensor_slices((shards, [*shards[slots:], *[""] * min(slots, len(shards))]))


def records_dataset(shards: list[str]) -> tf.data.Dataset:
    """The records of the shards in order, one shard after another (TFRecordDataset's order)."""
    return following_in_list(shards, 1).flat_map(shard_records)


def describe_reader(kind: str, files, *, read_parallelism: int | None, map_parallelism: int | None,
                    private_pool: int | None = None, gcs_reader: str = "tf") -> str:
    """The reader a pipeline over `files` runs, e.g. 's3fs (16 in flight)' or 'TF gs:// (...)'."""
    first = as_path(files[0]) if files else None  # a files source holds its images as text
    if needs_own_reader(files, gcs_reader):
        name = reader_name() if isinstance(first, S3Path) else "obstore on gs://"
        if kind == "files":
            requests = in_flight(read_parallelism if read_parallelism is not None else map_parallelism)
            return f"{name} ({requests} in flight)"
        blocks = f"{SHARD_BLOCK_BYTES >> 20} MB blocks after a {FIRST_BLOCK_BYTES >> 20} MB one, {BLOCKS_AHEAD} requested ahead, and the next shard's first"
        return f"{name} (records streamed in {blocks}; {pad_heaps()})"
    if isinstance(first, RemotePath):
        reads = ""
        if kind == "files" and read_parallelism is not None and read_parallelism > 1:
            pool = f" on a private pool of {private_pool} threads" if private_pool else ""
            reads = f"{read_parallelism} reads in flight{pool}; "
        return f"TF gs:// ({reads}{gcs_block_note()})"
    return "TF local files"


_FAILURE = re.compile(r"StorageError: ([^\n]+)")


def storage_failure(exc: Exception) -> StorageError | None:
    """The StorageError an s3:// read raised inside the pipeline, out of the TF error that carries it
    (TF reports a Python function's exception as an UnknownError with its text); None if it is not one.

    Raise it straight from the `except` clause, never from a local: a local ties the error to the frame
    that holds the pipeline's iterator (a reference cycle), so the iterator outlives the run until the
    garbage collector frees it, in whatever thread it runs. In one of the pipeline's own Python calls,
    freeing it waits for that very call to end: the process hangs."""
    found = _FAILURE.search(getattr(exc, "message", None) or str(exc))
    return StorageError(found.group(1).strip()) if found else None
