"""stallscope's readers in a tf.data pipeline of your own: list a tree, read image files, stream TFRecord
shards, from a local folder, `gs://` or `s3://`, with the same readers `stallscope train` runs.

Why: TF 2.21 cannot open `s3://` at all, and its `gs://` opens a new TCP+TLS connection for every
request, so a script of your own that reads a bucket object by object waits on handshakes (on 2 cores
through the emulated store at 10 ms, an AUTOTUNE map of `tf.io.read_file` read 55 JPEGs/s, 412-420
with 16 reads in flight, `read_files` 1,454-1,525: `benchmarks/own_pipeline.py`). `read_files`
fetches the objects in groups of requests over connections it keeps open; `read_records` streams
shards in large blocks, checking every record's checksums. Both fall back to TensorFlow's own reader
where it is the right one (local files; `gs://` where obstore, the storage extra, is not installed).
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from stallscope.config import usable_cores
from stallscope.errors import UsageError
from stallscope.storage import gcs_obstore, tfdata_readers
from stallscope.storage.location import RemotePath, as_path, read_many
from stallscope.storage.s3_request_plan import GROUP_REQUESTS, READ_STAGE, groups_in_flight

DEFAULT_IN_FLIGHT = 64  # requests at once: ~1,500 JPEGs/s at 10 ms per request keep ~20 busy


def list_files(url: str | os.PathLike, pattern: str = "*") -> list[str]:
    """Every file below `url` (a folder, `gs://bucket/prefix` or `s3://bucket/prefix`) whose name
    matches `pattern` (fnmatch, e.g. "*.jpg" or "train-*"), sorted, as strings `read_files` and
    `read_records` take. A bucket is listed once per process (sizes included: a shard opened later
    asks the store nothing before its first block)."""
    root = as_path(url)
    if isinstance(root, RemotePath):
        files = list(root.walk_files())
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file())
    elif root.is_file():
        files = [root]
    else:
        raise UsageError(f"{url}: expected a folder, gs://bucket/prefix or s3://bucket/prefix with files in it "
                         "(nothing is there)")
    return [str(p) for p in files if fnmatch.fnmatch(p.name, pattern)]


def _remote_bytes(batch: np.ndarray, group: int) -> np.ndarray:
    """The bytes of a batch of paths, in order: each store's objects through its reader, up to `group`
    at once; local paths read here."""
    paths = [as_path(p.decode()) for p in batch]
    out: list[bytes | None] = [None] * len(paths)
    by_store: dict[str, list[int]] = {}
    for index, path in enumerate(paths):
        if isinstance(path, RemotePath):
            by_store.setdefault(path.scheme, []).append(index)
        else:
            out[index] = Path(path).read_bytes()
    for indices in by_store.values():
        for index, data in zip(indices, read_many([paths[i] for i in indices], group)):
            out[index] = data
    return np.array(out, dtype=object)


def _with_pool(dataset: tf.data.Dataset, waiting_threads: int) -> tf.data.Dataset:
    """A private pool that leaves the cores to the rest of the pipeline while `waiting_threads` of its
    threads wait on the store (tf.data's shared pool has a thread per core: it would stall there)."""
    wanted = usable_cores() + waiting_threads
    current = dataset.options().threading.private_threadpool_size or 0
    if current >= wanted:
        return dataset
    options = tf.data.Options()
    options.threading.private_threadpool_size = wanted
    return dataset.with_options(options)


def read_files(dataset: tf.data.Dataset, in_flight: int = DEFAULT_IN_FLIGHT, *,
               deterministic: bool | None = None) -> tf.data.Dataset:
    """`dataset` with each file path replaced by the file's bytes: an element that is a scalar string
    (a path) becomes the bytes; in a tuple, its first component. Up to `in_flight` requests at once,
    in groups of up to 16 (a `tf.numpy_function` each), over the connections stallscope's readers keep
    open: s3:// always (TF cannot open it), gs:// where obstore is installed (else TF's client on as many
    threads), local paths read directly. The dataset gets a private thread pool of the cores plus the
    groups in flight (groups waiting on the store hold its threads). A missing object, refused
    credentials or a silent store fail the iteration with one line naming the object."""
    if in_flight < 1:
        raise UsageError(f"in_flight: expected 1 or more requests at once, got {in_flight!r}")
    spec = dataset.element_spec
    first = spec[0] if isinstance(spec, tuple) else spec
    if not (isinstance(first, tf.TensorSpec) and first.dtype == tf.string and first.shape.rank == 0):
        raise UsageError(f"read_files: expected a dataset of path strings, or of tuples whose first item is one; "
                         f"got elements {spec}")
    group = max(1, min(in_flight, GROUP_REQUESTS))
    groups = groups_in_flight(in_flight)

    def fetch_group(*batch):
        data = tf.numpy_function(lambda paths: _remote_bytes(paths, group), [batch[0]], tf.string,
                                 stateful=False, name="stallscope_read")
        data.set_shape(batch[0].shape)
        return (data, *batch[1:]) if isinstance(spec, tuple) else data

    batched = dataset.batch(group)
    fetched = batched.map(fetch_group, num_parallel_calls=groups if groups > 1 else None,
                          deterministic=deterministic if groups > 1 else None, name=f"{READ_STAGE}{in_flight}")
    return _with_pool(fetched.unbatch(), groups if groups > 1 else 0)


def _own_reader(shard: str) -> bool:
    """Shards streamed by stallscope's reader: s3:// always, gs:// where obstore is installed."""
    return tfdata_readers.needs_own_reader([as_path(shard)], "pooled" if gcs_obstore.available() else "tf")


def read_records(filenames, num_parallel_reads: int | None = None, *,
                 deterministic: bool | None = None) -> tf.data.Dataset:
    """The serialized records of TFRecord shards, as `tf.data.TFRecordDataset(filenames,
    num_parallel_reads=...)` gives them (one shard after another, or interleaved from that many at
    once), from a folder, gs:// or s3://. Shards in a bucket are streamed through stallscope's reader
    (s3:// always, gs:// where obstore is installed): 16 MB blocks after a 4 MB first one, the next
    asked for while one is parsed (and the next shard's first while a shard's last is), both checksums
    of every record checked (a corrupt frame ends the iteration with one line naming the shard and
    byte); elsewhere TFRecordDataset reads them."""
    shards = [filenames] if isinstance(filenames, (str, os.PathLike)) else list(filenames)
    shards = [str(s) for s in shards]
    if not shards:
        raise UsageError("read_records: expected one or more shard paths, got none")
    if num_parallel_reads is not None and num_parallel_reads < 1:
        raise UsageError(f"num_parallel_reads: expected None or 1 or more shards at once, got {num_parallel_reads!r}")
    own = [_own_reader(s) for s in shards]
    if not any(own):
        return tf.data.TFRecordDataset(shards, num_parallel_reads=num_parallel_reads)
    if not all(own):
        raise UsageError("read_records: expected shards in one kind of place (all in one store, or all local), "
                         f"got {shards[own.index(False)]} beside {shards[own.index(True)]}")
    files = tfdata_readers.following_in_list(shards, num_parallel_reads or 1)
    if num_parallel_reads is None:
        return files.flat_map(tfdata_readers.shard_records)
    records = files.interleave(tfdata_readers.shard_records, cycle_length=num_parallel_reads, block_length=1,
                               num_parallel_calls=num_parallel_reads, deterministic=deterministic)
    return _with_pool(records, num_parallel_reads)
