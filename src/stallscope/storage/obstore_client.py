"""Whole objects and byte ranges read through obstore (Rust object_store bindings), for any store
obstore speaks: the request threads, the per-process state and the ordered, bounded reads that the
s3:// reader (`s3_obstore`) and the pooled gs:// reader (`gcs_obstore`) share.

Each GET runs on a pool thread that waits outside the GIL while obstore's own runtime does the
request over kept-alive connections; a store is made once per bucket and process (again after a
fork: its connections and runtime belong to the process that made them). Every request is counted
with its bytes and time (`request_tally`): what `diagnose` measures of a real bucket.
"""

from __future__ import annotations

import abc
import concurrent.futures
import functools
import importlib.util
import os
import threading
from collections.abc import Callable
from pathlib import Path

from stallscope.storage import request_tally
from stallscope.storage.deadlines import StorageError, deadline, no_answer, with_deadline, with_silence_limit
from stallscope.storage.paths import ObjectInfo, RemotePath, list_by_folders

REQUEST_THREADS = 64  # GETs at once across a process's reads; each waits outside the GIL


def list_tree(store, prefix: str, what: str) -> dict[str, ObjectInfo]:
    """Every object below `prefix` ("" for the bucket) with its size and time, listed folder by folder
    (`paths.list_by_folders`), folder objects left out; an object at the prefix itself is {"": it},
    nothing there {}. Fails only when the store stops answering for `deadline()`; its other errors come
    as obstore raised them, for the store to put in one line."""
    import obstore

    files: dict[str, ObjectInfo] = {}

    def folder(sub: str) -> tuple[list, list[str]]:
        found = obstore.list_with_delimiter(store, sub or None)
        return found["objects"], found["common_prefixes"]

    def walk(heard: Callable[[], None]) -> None:
        for objects in list_by_folders(folder, prefix, heard):
            files.update(listed_objects(prefix, objects))

    def probe() -> None:  # a HEAD the store answers, found, missing or refused, while a large folder is listed
        from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError

        try:
            obstore.head(store, f"{prefix}/.stallscope-probe" if prefix else ".stallscope-probe")
        except (FileNotFoundError, NotFoundError, PermissionDeniedError, UnauthenticatedError):
            pass

    with_silence_limit(walk, deadline(), what, probe)
    without_folders(files)
    if files or not prefix:
        return files
    try:
        return {"": object_info(with_deadline(lambda: obstore.head(store, prefix), deadline(), what))}
    except FileNotFoundError:
        return {}  # no object at the prefix itself: an empty listing, as TF's


def listed_objects(prefix: str, page) -> dict[str, ObjectInfo]:
    """{name below `prefix`: its size and time} of a page of obstore's listing. A folder object
    ("PREFIX/", "PREFIX/a/": what TF's makedirs and the console write) comes without its slash, so
    the prefix's own is dropped here and the others by `without_folders`."""
    found = {}
    for meta in page:
        if meta["path"] == prefix:
            continue
        found[meta["path"][len(prefix) + 1:] if prefix else meta["path"]] = object_info(meta)
    return found


def object_info(meta) -> ObjectInfo:
    """The size and time of obstore's description of an object (a listing's entry, a HEAD)."""
    return ObjectInfo(int(meta["size"]), int(meta["last_modified"].timestamp() * 1e9))


def without_folders(files: dict[str, ObjectInfo]) -> None:
    """Drops the names that have objects below them: folder objects, as TF's listing takes them."""
    folders = {name.rsplit("/", depth)[0] for name in files for depth in range(1, name.count("/") + 1)}
    for folder in folders & set(files):
        del files[folder]


@functools.cache
def installed() -> bool:
    """True where obstore (the storage extra) is installed; asked once (a lookup costs ~30 us, and the
    readers ask before every read)."""
    return importlib.util.find_spec("obstore") is not None


def read_ca_bundle(bundle: str, source: str) -> bytes:
    """The PEM certificates in the file `bundle` that `source` (the setting) names, for a store behind
    a private CA: obstore trusts them beside the system's roots. A file that cannot be read or holds
    no certificate is one line naming `source`."""
    try:
        pem = Path(bundle).expanduser().read_bytes()
    except OSError as exc:
        raise StorageError(f"{source}: expected a readable PEM file of CA certificates, got {bundle!r} "
                           f"({exc.strerror or exc})") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise StorageError(f"{source}: expected a PEM file of CA certificates, got {bundle!r} (no certificate in it)")
    return pem


class ObstoreReader(abc.ABC):
    """One obstore store per bucket and a pool of request threads, per process (made again after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._stores: dict[str, object] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _fresh(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._stores = {}
            self._pool = concurrent.futures.ThreadPoolExecutor(REQUEST_THREADS, thread_name_prefix="obstore-get")
            self._forget_process_state()

    def _forget_process_state(self) -> None:
        """What a subclass keeps per process, dropped in a fresh one (a forked child)."""

    @abc.abstractmethod
    def _new_store(self, bucket: str):
        """The obstore store of `bucket`, made with this store's credentials, endpoint and timeouts."""

    def store(self, bucket: str):
        with self._lock:
            self._fresh()
            if bucket not in self._stores:
                self._stores[bucket] = self._new_store(bucket)
            return self._stores[bucket]

    def size(self, path: RemotePath) -> int:
        import obstore

        store = self.store(path.bucket)
        return int(request_tally.timed(lambda: obstore.head(store, path.key), lambda _: 0)["size"])

    def request_range(self, path: RemotePath, start: int, end: int) -> concurrent.futures.Future:
        """Bytes [start, end) of an object, fetched on a request thread; the future holds them as
        obstore's own buffer (bytes-like, read in place: copying each 16 MB block into fresh pages
        cost 0.14 ms of CPU per 75 KB record of it, against 0.04 for the GET alone, on 2 cores)."""
        import obstore

        store = self.store(path.bucket)
        return self._pool.submit(request_tally.timed, lambda: obstore.get_range(store, path.key, start=start, end=end))

    def read_many(self, paths: list[RemotePath], in_flight: int,
                  error: Callable[[RemotePath, BaseException], StorageError]) -> list[bytes]:
        """The objects' bytes in order, up to `in_flight` GETs at once; the first failure raises
        `error(path, exception)`, the one line naming the object."""
        import obstore

        try:
            stores = [self.store(p.bucket) for p in paths]
        except StorageError:
            raise
        except Exception as exc:
            raise error(paths[0], exc) from None
        pool = self._pool
        out: list[bytes] = []
        step = max(1, in_flight)
        for start in range(0, len(paths), step):
            pending = [pool.submit(request_tally.timed, lambda s=store, k=path.key: bytes(obstore.get(s, k).bytes()))
                       for store, path in zip(stores[start:start + step], paths[start:start + step])]
            for path, future in zip(paths[start:start + step], pending):
                try:
                    out.append(future.result(timeout=deadline()))
                    continue
                except concurrent.futures.TimeoutError:
                    failure = no_answer(path, deadline())
                except Exception as exc:  # obstore's errors, OSError kinds: all one line
                    failure = error(path, exc)
                for other in pending:
                    other.cancel()
                raise failure from None
        return out


def storage_error_text(exc: BaseException) -> str:
    """obstore's message without its multi-line debug dump."""
    return " ".join(str(exc).split("Debug source:", 1)[0].split())
