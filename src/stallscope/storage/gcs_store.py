"""gs:// through TensorFlow's own GCS file system (`tf.io.gfile`, built into the TF 2.21 CPU wheel),
and through obstore where it is installed (`gcs_obstore`) for what TF's client does one connection
and one request at a time: listings (sizes come with the names), whole objects (convert's chunks, a
Beam worker's images, verify's shards) and the pipelines that ask for the pooled reader. Writes stay
on TF's client.

TF's client reads its settings from the environment once, when TensorFlow loads (tsl's
gcs_file_system.cc: GCS_REQUEST_CONNECTION_TIMEOUT_SECS, GCS_REQUEST_IDLE_TIMEOUT_SECS,
GCS_METADATA_REQUEST_TIMEOUT_SECS, GCS_RETRY_CONFIG_MAX_RETRIES, GCS_READ_CACHE_BLOCK_SIZE_MB, ...), so
`prepare_gcs_environment` runs before `import tensorflow`. Its endpoints are fixed; it honours
HTTPS_PROXY and CURL_CA_BUNDLE, which is how a local emulator is reached.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from stallscope.storage import gcs_obstore
from stallscope.storage.obstore_client import list_tree, storage_error_text
from stallscope.storage.deadlines import StorageError, deadline, refused, refused_connection, short, with_deadline
from stallscope.storage.paths import Listing, ObjectInfo, RemotePath, Store, as_path

logger = logging.getLogger(__name__)

# Requests a listing keeps in flight for the sizes (TF's listing gives names only: one stat per object).
LIST_IN_FLIGHT = 32
MAX_DEPTH = 16  # folder levels a listing descends
# TF's client retries a failed request this many times (its own default is 10, with back-off up to
# 32 s: minutes before a dead store is reported).
GCS_RETRIES = 2
GCS_BLOCK_VAR = "GCS_READ_CACHE_BLOCK_SIZE_MB"
# TF gives every opened object a read buffer of this many MB (64 by default: ~46 ms of CPU per small
# object, tensorflow#30327). One MB holds a typical JPEG in one request.
SMALL_OBJECT_BLOCK_MB = 1

T = TypeVar("T")

_set_by_us: set[str] = set()  # the TF variables prepare_gcs_environment set


def gcs_endpoint() -> tuple[str, str]:
    """Where a gs:// request goes first, and what it is: the proxy curl (and so TF's gs://) uses, else
    Google's endpoint."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    return (proxy, "HTTPS proxy") if proxy else ("storage.googleapis.com", "store")


def prepare_gcs_environment(timeout_s: float, *, small_objects: bool) -> list[str]:
    """Sets TF's gs:// knobs the user left unset; returns them as NAME=value.

    TF's GCS file system reads these once, when TensorFlow loads (tsl gcs_file_system.cc), so this
    runs before `import tensorflow`. `small_objects` (a JPEG tree) sets the read block size to
    SMALL_OBJECT_BLOCK_MB instead of TF's 64 MB buffer per opened object (tensorflow#30327).
    """
    seconds = str(max(1, round(timeout_s)))
    wanted = {
        "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": seconds,
        "GCS_REQUEST_IDLE_TIMEOUT_SECS": seconds,
        "GCS_METADATA_REQUEST_TIMEOUT_SECS": seconds,
        "GCS_RETRY_CONFIG_MAX_RETRIES": str(GCS_RETRIES),
        "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "500000",
    }
    if small_objects:
        wanted[GCS_BLOCK_VAR] = str(SMALL_OBJECT_BLOCK_MB)
    set_now = []
    for name, value in wanted.items():
        if name not in os.environ:
            os.environ[name] = value
            _set_by_us.add(name)
            set_now.append(f"{name}={value}")
    if set_now and "tensorflow" in sys.modules:
        logger.warning("TensorFlow was loaded before the gs:// settings %s; they apply from the next process", set_now)
    return set_now


def gcs_block_note() -> str:
    """TF's gs:// read block here, and who set it, for the run record."""
    value = os.environ.get(GCS_BLOCK_VAR)
    if not value:
        return f"{GCS_BLOCK_VAR} unset: a 64 MB buffer per object"
    return f"{GCS_BLOCK_VAR}={value}" + (", set by stallscope" if GCS_BLOCK_VAR in _set_by_us else "")


class GcsStore(Store):
    """gs:// through TensorFlow's own GCS file system, and through obstore where installed for
    listings, bulk reads and a pipeline with `gcs_reader="pooled"` (`objects`, `read_pooled`, `size`,
    `request_range`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: gcs_obstore.GcsObjectReader | None = None

    def objects(self) -> gcs_obstore.GcsObjectReader:
        """The pooled reader (obstore; one per store, remade in a forked child)."""
        with self._lock:
            if self._objects is None:
                self._objects = gcs_obstore.GcsObjectReader()
            return self._objects

    def read_pooled(self, paths: list[RemotePath], in_flight: int) -> list[bytes]:
        """The objects' bytes in order through the pooled reader, up to `in_flight` GETs at once."""
        return self.objects().read_many(paths, in_flight, self.error)

    def size(self, path: RemotePath) -> int:
        """An object's size, asked of the store through the pooled reader (a HEAD)."""
        try:
            return self.objects().size(path)
        except StorageError:
            raise
        except Exception as exc:
            raise self.error(path, exc) from None

    def request_range(self, path: RemotePath, start: int, end: int) -> concurrent.futures.Future:
        """Bytes [start, end) of an object through the pooled reader, asked for now."""
        return self.objects().request_range(path, start, end)

    def error(self, path: RemotePath, exc: BaseException) -> StorageError:
        """The one line for a failed request through obstore (its errors' text names the cause)."""
        if isinstance(exc, StorageError):
            return exc
        text = storage_error_text(exc)
        lowered = text.lower()
        if "token request" in lowered or "application default credentials" in lowered or "computemetadata" in lowered:
            return StorageError(f"{path}: no credentials for gs:// ({short(text)}); expected Application Default "
                                "Credentials (GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`)")
        if re.search(r"\b(401|403)\b", text):
            return StorageError(f"{path}: gs:// refused the credentials ({short(text)}); expected Application Default "
                                "Credentials that may read this bucket")
        if "bucket does not exist" in lowered:
            return StorageError(f"{path}: bucket {path.bucket!r} does not exist (or these credentials cannot see it); "
                                "expected an existing bucket")
        if isinstance(exc, FileNotFoundError) or " 404 " in text:
            return StorageError(f"{path}: no such object; expected one that exists")
        if "certificate" in lowered:
            return StorageError(f"{path}: the store sent a TLS certificate this machine does not trust ({short(text)}); "
                                "expected CURL_CA_BUNDLE naming its CA")
        if refused_connection(exc):  # a longer timeout cannot help: nothing listens
            return refused(path, *gcs_endpoint())
        if any(word in lowered for word in ("error sending request", "connect", "timed out", "timeout")) \
                or isinstance(exc, (TimeoutError, ConnectionError)):
            return StorageError(f"{path}: the store did not answer ({short(text)}); expected a reachable "
                                "storage.googleapis.com (or HTTPS_PROXY) within --storage-timeout")
        return StorageError(f"{path}: gs:// failed ({type(exc).__name__}: {short(text)})")

    @staticmethod
    def _tf():
        from stallscope.tfimport import import_tensorflow

        return import_tensorflow()

    def _errors(self, path: RemotePath, exc: Exception, action: str = "read") -> StorageError:
        tf = self._tf()
        text = " ".join(str(exc).split())
        text = libcurl_reason(text)
        if action != "read" and (isinstance(exc, tf.errors.PermissionDeniedError) or " 403" in text):
            return StorageError(f"{path}: gs:// refused to {action} ({short(text)}); expected credentials and a bucket "
                                f"that allow storage.objects.{'create' if action == 'write' else 'delete'} here")
        if isinstance(exc, (tf.errors.UnauthenticatedError, tf.errors.PermissionDeniedError)) or " 401" in text or " 403" in text:
            return StorageError(f"{path}: gs:// refused the credentials ({short(text)}); expected Application Default "
                                "Credentials (GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`) "
                                "that may read this bucket")
        if refused_connection(exc):
            return refused(path, *gcs_endpoint())
        if "libcurl" in text or isinstance(exc, (tf.errors.AbortedError, tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
            return StorageError(f"{path}: the store did not answer ({short(text)}); expected a reachable "
                                "storage.googleapis.com (or HTTPS_PROXY) within --storage-timeout")
        return StorageError(f"{path}: gs:// failed ({short(text)})")

    def _call(self, path: RemotePath, fn: Callable[[], T], action: str = "read") -> T:
        tf = self._tf()
        try:
            return fn()
        except tf.errors.OpError as exc:
            raise self._errors(path, exc, action) from None

    def list(self, root: RemotePath) -> Listing:
        """Every object under `root`: through obstore where installed (a paged listing that carries
        each object's size: 2 requests for 1,601 objects, where TF's client lists names and then asks
        each object's size, a request and a TLS handshake each), else TF's client."""
        if gcs_obstore.available():
            listing = self._list_pooled(root)
            if listing is not None:
                return listing
        return self._list_tf(root)

    def _list_pooled(self, root: RemotePath) -> Listing | None:
        """The listing through obstore; None where obstore cannot take these keys (TF's then lists
        them); the store's own failures are one line, as TF's are."""
        try:
            files = list_tree(self.objects().store(root.bucket), root.key.strip("/"), str(root))
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the store's failures are one line; obstore's own, TF's turn
            failure = self.error(root, exc)
            if str(failure).startswith(f"{root}: gs:// failed"):
                logger.info("%s: obstore could not list it (%s); listing through TF's gs://", root, failure)
                return None
            raise failure from None
        logger.info("%s: listed %d objects", root, len(files))
        return Listing(root, files)

    def _list_tf(self, root: RemotePath) -> Listing:
        tf = self._tf()
        url = str(root)
        exists = with_deadline(lambda: self._call(root, lambda: tf.io.gfile.exists(url)), deadline(), str(root))
        if not exists:
            bucket = as_path(f"gs://{root.bucket}")
            if root.key and not self._call(root, lambda: tf.io.gfile.exists(str(bucket))):
                raise StorageError(f"{root}: bucket {root.bucket!r} does not exist (or these credentials cannot see it); expected an existing bucket")
            return Listing(root, {})  # an empty prefix: it does not exist (yet)
        if not self._call(root, lambda: tf.io.gfile.isdir(url)):
            stat = self._call(root, lambda: tf.io.gfile.stat(url))
            return Listing(root, {"": ObjectInfo(stat.length, stat.mtime_nsec)})
        names = self._names_below(root)

        def stat(name: str) -> tuple[str, ObjectInfo]:
            info = self._call(root, lambda: tf.io.gfile.stat(f"{url}/{name}"))
            return name, ObjectInfo(int(info.length), int(info.mtime_nsec))

        with concurrent.futures.ThreadPoolExecutor(LIST_IN_FLIGHT) as pool:
            files = dict(pool.map(stat, names))
        logger.info("%s: listed %d objects", root, len(files))
        return Listing(root, files)

    def _names_below(self, root: RemotePath) -> list[str]:
        """Every object name below `root`, relative to it. One glob per depth: TF answers a glob with one
        recursive, paged listing of the prefix (a walk would list each folder and ask of every entry
        whether it is a folder, one request each)."""
        tf = self._tf()
        url = str(root)
        found: set[str] = set()
        for depth in range(1, MAX_DEPTH + 1):
            matches = self._call(root, lambda: tf.io.gfile.glob(url + "/*" * depth))
            if not matches:
                break
            found |= {m[len(url) + 1:].rstrip("/") for m in matches}
        folders = {name.rsplit("/", 1)[0] for name in found if "/" in name}
        return sorted(found - folders)

    def read(self, path: RemotePath) -> bytes:
        """One whole object: through the pooled reader where obstore is installed (a Beam worker's
        images, verify's shards, a manifest), else TF's client."""
        if gcs_obstore.available():
            return self.read_pooled([path], 1)[0]
        tf = self._tf()

        def read() -> bytes:
            with tf.io.gfile.GFile(str(path), "rb") as handle:
                return handle.read()

        return self._call(path, read)

    def read_many(self, paths: list[RemotePath], in_flight: int) -> list[bytes]:
        """Many whole objects (convert's chunks of a JPEG tree): through the pooled reader where obstore
        is installed, whose kept-alive connections spare each object TF's TCP+TLS handshake, else TF's
        client on `in_flight` threads."""
        if gcs_obstore.available():
            return self.read_pooled(paths, in_flight)
        return super().read_many(paths, in_flight)

    def write(self, path: RemotePath, data: bytes) -> None:
        tf = self._tf()

        def write() -> None:
            with tf.io.gfile.GFile(str(path), "wb") as handle:
                handle.write(data)

        self._call(path, write, "write")

    def upload(self, local: Path, path: RemotePath) -> None:
        tf = self._tf()
        self._call(path, lambda: tf.io.gfile.copy(str(local), str(path), overwrite=True), "write")

    def rename(self, src: RemotePath, dst: RemotePath) -> None:
        tf = self._tf()
        self._call(dst, lambda: tf.io.gfile.rename(str(src), str(dst), overwrite=True), "write")

    def delete(self, path: RemotePath) -> None:
        tf = self._tf()
        self._call(path, lambda: tf.io.gfile.remove(str(path)), "delete")


def libcurl_reason(text: str) -> str:
    """TF's gs:// error reduced to its libcurl cause ("libcurl code 7 meaning 'Could not connect to
    server'"), where it names one; else the text."""
    curl = re.search(r"libcurl code \d+ meaning '[^']*'", text)
    return curl.group(0) if curl else text
