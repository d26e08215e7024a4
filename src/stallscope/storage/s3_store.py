"""s3:// through obstore (TF 2.21 has no s3://; tensorflow-io does not load against it): listings,
reads, writes, uploads, renames (a copy, then a delete) and deletes, one client for every use
(`s3_obstore` makes its stores). STALLSCOPE_S3_READER=s3fs reads objects through fsspec/s3fs instead
(the s3fs extra), for comparing with a program of your own that reads with s3fs; listings and writes
stay on obstore.

Each request has the storage timeout (connect, and the whole request), one retry within it: a store
that accepts connections and never answers fails each operation within about --storage-timeout. A
transfer may take the timeout plus its bytes at SLOWEST_BYTES_PER_S (`operation_limit`): a shard's
upload is not cut off by the deadline of a small request. Through s3fs each operation, its retries
included (botocore's attempts, s3fs's retries), has that one deadline too, not every retry waiting the
whole timeout (23-29 s at 3 s, minutes at 30 s). Credentials and the endpoint come from the usual
AWS environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ~/.aws, AWS_ENDPOINT_URL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from stallscope.errors import UsageError
from stallscope.extras import install_line
from stallscope.storage import s3_obstore
from stallscope.storage.deadlines import StorageError, refused, refused_connection, short, storage_timeout
from stallscope.storage.obstore_client import installed, list_tree, storage_error_text
from stallscope.storage.paths import Listing, RemotePath, Store, listed_size
from stallscope.storage.s3_request_plan import READER_ENV, reader_name

logger = logging.getLogger(__name__)

S3_CONNECTIONS = 64  # open connections s3fs's client keeps, so requests in flight do not queue for one
# A transfer may take the timeout plus its bytes at this rate: a shard's upload is not cut off by the
# deadline of a small request, and a store slower than this past the timeout counts as not answering.
SLOWEST_BYTES_PER_S = 1 << 20
# Operations that move at most this many bytes go through the bucket's kept store (requests of the
# storage timeout: at SLOWEST_BYTES_PER_S these bytes add 0.06 s); larger ones get a store of their own.
SMALL_TRANSFER = 64 * 1024
# An upload of at least this many bytes goes in parts (s3fs's put_file sends up to twice its 50 MiB
# block as one PUT), this many bytes each, this many at once.
MULTIPART_FROM = 100 * 1024 * 1024
MULTIPART_PART_BYTES = 16 * 1024 * 1024
MULTIPART_IN_FLIGHT = 4

T = TypeVar("T")
_XML_CODE = re.compile(r"<Code>([^<]+)</Code>")
_RUSTLS_CERTIFICATE = re.compile(r"InvalidCertificate\(\s*(\w+)")
_OPENSSL_CERTIFICATE = re.compile(r"certificate verify failed[^)'\]\n]*", re.IGNORECASE)


def operation_limit(nbytes: int = 0) -> float:
    """Seconds one operation on the store may take, retries included: --storage-timeout, plus
    `nbytes` at SLOWEST_BYTES_PER_S for one that moves them."""
    return storage_timeout() + nbytes / SLOWEST_BYTES_PER_S


def _is_deadline(exc: BaseException) -> bool:
    """Whether `exc` is an operation's deadline passing (fsspec's, or asyncio's in `request_range`):
    a bare TimeoutError with nothing to say, unlike botocore's and aiohttp's timeouts."""
    return isinstance(exc, TimeoutError) and not str(exc)


@functools.cache
def _one_get(client_type: type) -> dict[str, int]:
    """s3fs 2026.2+ wants an object's size before reading it whole, to split a large one into
    concurrent ranged GETs (fsspec/s3fs#1027); without its listings cache that is a HEAD per JPEG,
    which doubles the requests, adds a round trip and costs about a millisecond of CPU per image.
    `max_concurrency=1` makes it one GET; older versions, which send no HEAD, do not take it."""
    return {"max_concurrency": 1} if "max_concurrency" in inspect.signature(client_type._cat_file).parameters else {}


def _untrusted_certificate(exc: BaseException) -> str | None:
    """Why the store's TLS certificate was refused (obstore's rustls, or botocore's and aiohttp's
    OpenSSL), or None when that is not what failed."""
    for candidate in (exc, exc.__cause__, exc.__context__):
        if candidate is None:
            continue
        text = str(candidate)  # obstore's reason is in its debug dump, after the one-line message
        if found := _RUSTLS_CERTIFICATE.search(text):
            return f"InvalidCertificate: {found.group(1)}"
        if found := _OPENSSL_CERTIFICATE.search(text):
            return found.group(0)
    return None


class S3Store(Store):
    """s3:// through obstore (`objects`: one store per bucket and process), and through fsspec/s3fs
    for reads where STALLSCOPE_S3_READER=s3fs asks (`fs`: one client per process, with an event loop
    of its own: requests a failed run left behind stay on the loop of the client they were made by,
    not on fsspec's shared one, where they held up the next client's requests)."""

    def __init__(self) -> None:
        self._fs = None
        self._pid = 0
        self._lock = threading.Lock()
        self._objects: s3_obstore.ObjectReader | None = None

    def objects(self) -> s3_obstore.ObjectReader:
        """The obstore stores (one reader per store; it remakes itself after a fork)."""
        if not installed():
            raise UsageError(f"s3:// needs the obstore package: {install_line('stores')}")
        with self._lock:
            if self._objects is None:
                self._objects = s3_obstore.ObjectReader()
            return self._objects

    def fs(self):
        with self._lock:  # tf.data threads ask at once on the first read
            if self._fs is None or self._pid != os.getpid():
                self._fs = self._new_client()
                self._pid = os.getpid()
            return self._fs

    def _new_client(self):
        try:
            import s3fs
        except ImportError:
            raise UsageError(f"{READER_ENV}=s3fs needs the s3fs package: {install_line('s3fs')}") from None
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="s3-io", daemon=True).start()
        seconds = storage_timeout()
        fs = s3fs.S3FileSystem(
            loop=loop,
            skip_instance_cache=True,
            # Our own listing is the cache (paths.Listing); s3fs's would hold about 1 KB more per
            # object (1.2 GB for ImageNet's 1.28 million training images), and reads need no sizes.
            use_listings_cache=False,
            config_kwargs={"connect_timeout": seconds, "read_timeout": seconds,
                           "retries": {"max_attempts": 2, "mode": "standard"},
                           # botocore's pool holds 10 connections: fewer than a pipeline keeps in flight
                           "max_pool_connections": S3_CONNECTIONS},
        )
        fs.retries = 2  # s3fs's own retries of dropped connections (5 by default)
        return fs

    def error(self, path: RemotePath, exc: BaseException, action: str = "read") -> StorageError:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the S3 endpoint"
        if _is_deadline(exc):  # the operation's deadline, retries included: what each try said is gone with it
            return StorageError(f"{path}: the store at {endpoint} did not answer within {storage_timeout():.0f} s; "
                                "expected a reachable S3 endpoint within --storage-timeout")
        name = type(exc).__name__
        text = storage_error_text(exc)
        cause = exc.__cause__ or exc.__context__
        code = ""
        for candidate in (exc, cause):
            response = getattr(candidate, "response", None)
            if isinstance(response, dict):
                code = response.get("Error", {}).get("Code", "") or code
        if not code and (found := _XML_CODE.search(text)):  # obstore: the store's XML error, as text
            code = found.group(1)
        if name in ("NoCredentialsError", "PartialCredentialsError") or "Unable to locate credentials" in text:
            return StorageError(f"{path}: no credentials for s3://; expected AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "AccessDenied") \
                or isinstance(exc, PermissionError):
            why = code or short(text)
            if action == "read" or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"):
                return StorageError(f"{path}: s3:// refused the credentials ({why}); expected AWS credentials that may "
                                    f"{action} this bucket")
            return StorageError(f"{path}: s3:// refused to {action} ({why}); expected credentials and a bucket policy "
                                f"that allow s3:{'PutObject' if action == 'write' else 'DeleteObject'} here")
        if code == "NoSuchBucket" or "NoSuchBucket" in text or "bucket does not exist" in text.lower():
            return StorageError(f"{path}: bucket {path.bucket!r} does not exist; expected an existing bucket")
        if (untrusted := _untrusted_certificate(exc)) is not None:
            return StorageError(f"{path}: the store at {endpoint} sent a TLS certificate this machine does not trust "
                                f"({untrusted}); expected AWS_CA_BUNDLE (or the profile's ca_bundle) naming its CA")
        if refused_connection(exc):  # before the "connect" words below: a longer timeout cannot help here
            return refused(path, endpoint)
        if any(word in name for word in ("Endpoint", "Timeout", "Connect", "ClientOSError", "ServerDisconnected")) \
                or any(word in text.lower() for word in ("connect", "timeout", "timed out", "error sending request")) \
                or isinstance(exc, (TimeoutError, ConnectionError)):
            return StorageError(f"{path}: the store at {endpoint} did not answer ({short(text)}); "
                                "expected a reachable S3 endpoint within --storage-timeout")
        if isinstance(exc, FileNotFoundError):
            return StorageError(f"{path}: no such object or prefix; expected one that exists")
        return StorageError(f"{path}: s3:// failed ({name}: {short(text)})")

    def _call(self, path: RemotePath, fn: Callable[[], T], action: str = "read") -> T:
        try:
            return fn()
        except UsageError:  # a StorageError already, or a missing package's install line
            raise
        except Exception as exc:  # obstore's, botocore's, aiohttp's and OSError kinds: all one line
            raise self.error(path, exc, action) from None

    def _do(self, path: RemotePath, action: str, method: str, *args, nbytes: int = 0, **kwargs):
        """`fs.method(*args, **kwargs)` within `operation_limit(nbytes)`, retries included: fsspec
        cancels the request on the client's loop when the deadline passes (nothing is left waiting)."""
        fs = self.fs()
        return self._call(path, lambda: getattr(fs, method)(*args, timeout=operation_limit(nbytes), **kwargs), action)

    def list(self, root: RemotePath) -> Listing:
        """Every object under `root`, its folders listed several at a time (`list_by_folders`),
        folder placeholders ("a/") left out, through obstore whichever reader reads (ImageNet train's
        1.28 million objects from the emulated store, listed and planned: 19 s of CPU, against 104 s
        through s3fs). A missing bucket, or a listing refused, is the store's own error, in one line."""
        files = self._obstore(root, "read", lambda store: list_tree(store, root.key.strip("/"), str(root)))
        logger.info("%s: listed %d objects", root, len(files))
        return Listing(root, files)

    def _obstore(self, path: RemotePath, action: str, fn: Callable[[object], T], nbytes: int = 0) -> T:
        """`fn(store)` with `path`'s bucket's obstore store, its failures one line naming `path`. An
        operation that moves `nbytes` past SMALL_TRANSFER gets a store whose requests may take
        `operation_limit(nbytes)`; the others, the bucket's kept store (requests of the storage timeout)."""
        def call() -> T:
            objects = self.objects()
            if nbytes > SMALL_TRANSFER:
                return fn(objects.store_for_transfer(path.bucket, operation_limit(nbytes)))
            return fn(objects.store(path.bucket))

        return self._call(path, call, action)

    def _key(self, path: RemotePath) -> str:
        return f"{path.bucket}/{path.key}"

    def read(self, path: RemotePath) -> bytes:
        if reader_name() == "obstore":
            return self.objects().read_many([path], 1, self.error)[0]
        return self._do(path, "read", "cat_file", self._key(path), nbytes=listed_size(path) or 0,
                        **_one_get(type(self.fs())))

    def read_many(self, paths: list[RemotePath], in_flight: int) -> list[bytes]:
        if reader_name() == "obstore":
            return self.objects().read_many(paths, in_flight, self.error)
        keys = [self._key(p) for p in paths]
        nbytes = sum(listed_size(p) or 0 for p in paths)
        found = self._do(paths[0], "read", "cat", keys, batch_size=max(1, in_flight), on_error="return",
                         nbytes=nbytes, **_one_get(type(self.fs())))
        out = []
        for path, key in zip(paths, keys):
            value = found.get(key)
            if isinstance(value, BaseException) or value is None:
                raise self.error(path, value or FileNotFoundError(key))
            out.append(value)
        return out

    def size(self, path: RemotePath) -> int:
        """An object's size, asked of the store (a HEAD): a shard's blocks are planned from it."""
        if reader_name() == "obstore":
            return self._call(path, lambda: self.objects().size(path))  # one line, as a read's failure
        return int(self._do(path, "read", "info", self._key(path))["size"])

    def request_range(self, path: RemotePath, start: int, end: int) -> concurrent.futures.Future:
        """Bytes [start, end) of an object, asked for now; the future holds them (or the error)."""
        if reader_name() == "obstore":
            return self.objects().request_range(path, start, end)
        fs = self.fs()
        request = asyncio.wait_for(fs._cat_file(self._key(path), start=start, end=end), operation_limit(end - start))
        return asyncio.run_coroutine_threadsafe(request, fs.loop)

    def write(self, path: RemotePath, data: bytes) -> None:
        """One PUT of `data` (a manifest, a lease, a run's state)."""
        self._obstore(path, "write", lambda store: obstore_put(store, path.key, data, use_multipart=False),
                      nbytes=len(data))

    def upload(self, local: Path, path: RemotePath) -> None:
        """A local file (a shard) as one PUT up to MULTIPART_FROM bytes, as s3fs's put_file sends it;
        a larger one in parts of MULTIPART_PART_BYTES, which a store that refuses multipart uploads
        (the emulator) cannot take."""
        size = local.stat().st_size
        self._obstore(path, "write", lambda store: obstore_put(
            store, path.key, local, use_multipart=size >= MULTIPART_FROM, chunk_size=MULTIPART_PART_BYTES,
            max_concurrency=MULTIPART_IN_FLIGHT), nbytes=size if size < MULTIPART_FROM else MULTIPART_PART_BYTES)

    def rename(self, src: RemotePath, dst: RemotePath) -> None:
        """A copy within the store and a delete, each its own request: a failed copy names `dst`, a
        failed delete `src`."""
        import obstore

        self._obstore(dst, "write", lambda store: obstore.copy(store, src.key, dst.key),
                      nbytes=listed_size(src) or 0)
        self.delete(src)

    def delete(self, path: RemotePath) -> None:
        """The object removed (S3 answers a delete of a missing key as done)."""
        import obstore

        self._obstore(path, "delete", lambda store: obstore.delete(store, path.key))


def obstore_put(store, key: str, data, **options) -> None:
    import obstore

    obstore.put(store, key, data, **options)
