"""Data locations: a local path, `gs://bucket/prefix` or `s3://bucket/prefix`, behind one path type.

`as_path(text)` gives a `pathlib.Path` for a local path and a `RemotePath` for a URL. A `RemotePath` is
a pure POSIX path (so `/`, `.name`, `.suffix`, `.parent` and `relative_to` work as on a `Path`) whose
`exists`, `is_dir`, `iterdir` and `stat` answer from one recursive listing of its root, made on first
use and kept for the life of the process: a tree is listed once per run, not per epoch or per question.
Bytes go through each store's own client: gs:// through TensorFlow's file system (`tf.io.gfile`, built
into TF 2.21), s3:// through obstore (TF 2.21 has no s3://). Credentials come from each store's
usual environment (Application Default Credentials for gs://; AWS_* variables, ~/.aws or
AWS_ENDPOINT_URL for s3://).

Whatever goes wrong with a store (no or refused credentials, a missing bucket or prefix, a store that
does not answer) is a `StorageError`: one line, raised within the storage timeout.

This module is the upper half: it picks each scheme's client (`backend`) and writes through it. The
paths, listings and the `Store` base are in `paths`, the errors and deadlines in `deadlines`: the
clients (`gcs_store`, `s3_store`, their obstore readers) build on those two, never on this module, and
everything is reachable from here as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from stallscope.errors import UsageError  # noqa: F401 (callers reach it through location)
from stallscope.storage.deadlines import (  # noqa: F401 (callers reach these through location)
    DEFAULT_TIMEOUT_S, StorageError, abandoned_requests, deadline, no_answer, set_storage_timeout, short,
    storage_timeout, with_deadline, with_silence_limit,
)
from stallscope.storage.paths import (  # noqa: F401 (callers reach these through location)
    FOLDERS_IN_FLIGHT, SCHEMES, GsPath, Listing, ObjectInfo, RemotePath, S3Path, Store, as_path, forget_listings,
    is_remote, list_by_folders, listed_info, listed_size, record_change, serve_paths_with,
)


def set_timeout(seconds: float) -> None:
    """Connect and read timeout for every store request from now on (s3:// and gs://'s pooled reader
    at once; TF's own gs:// needs `gcs_store.prepare_gcs_environment` before TensorFlow loads)."""
    set_storage_timeout(seconds)
    _STORES.pop("s3", None)  # their clients are made with the timeout
    _STORES.pop("gs", None)


# --- reading and writing --------------------------------------------------------------------------


def read_many(paths: list[RemotePath], in_flight: int) -> list[bytes]:
    """The bytes of `paths`, in order, with up to `in_flight` requests at once."""
    if not paths:
        return []
    return backend(paths[0]).read_many(paths, in_flight)


def temporary_name(path: RemotePath) -> RemotePath:
    """`.NAME.tmp-PID` beside `path`: the name `records.writer.is_temporary` recognises."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_bytes(path: RemotePath, data: bytes) -> None:
    """Writes `path` under a temporary name, then renames it, so a reader never sees part of it."""
    store = backend(path)
    tmp = temporary_name(path)
    store.write(tmp, data)
    store.rename(tmp, path)
    record_change(path, ObjectInfo(len(data), 0))


def upload_file(local: Path, path: RemotePath) -> None:
    """Copies a local file to `path` under a temporary name, then renames it."""
    store = backend(path)
    tmp = temporary_name(path)
    store.upload(local, tmp)
    store.rename(tmp, path)
    record_change(path, ObjectInfo(local.stat().st_size, 0))


def delete(path: RemotePath) -> None:
    backend(path).delete(path)
    record_change(path, None)


def backend(path: RemotePath) -> "Store":
    """The client of `path`'s store, made on first use (obstore and botocore are imported only for a
    store's first request)."""
    if path.scheme not in _STORES:
        if path.scheme == "gs":
            from stallscope.storage.gcs_store import GcsStore as store_class
        else:
            from stallscope.storage.s3_store import S3Store as store_class
        _STORES[path.scheme] = store_class()
    return _STORES[path.scheme]


_STORES: dict[str, "Store"] = {}

serve_paths_with(backend)  # every RemotePath reaches its store through backend
