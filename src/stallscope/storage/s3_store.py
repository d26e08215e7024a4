"""s3:// through fsspec/s3fs (TF 2.21 has no s3://; tensorflow-io does not load against it): listings
and writes, and reads where obstore is not the reader (`s3_obstore` reads otherwise).

One client per process (made again in a forked child), with botocore's connect and read timeouts set
to the storage timeout, two attempts, and enough pooled connections for a pipeline's requests in
flight. Each operation, its retries included (botocore's attempts, s3fs's retries), has one deadline
(`operation_limit`): a store that accepts connections and never answers fails within about
--storage-timeout, not after every retry waited the whole timeout (23-29 s at 3 s, minutes at 30 s). Credentials and the endpoint come from the usual AWS environment (AWS_ACCESS_KEY_ID,
AWS_PROFILE, ~/.aws, AWS_ENDPOINT_URL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
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
from stallscope.storage.deadlines import StorageError, short, storage_timeout, with_silence_limit
from stallscope.storage.paths import Listing, ObjectInfo, RemotePath, Store, list_by_folders, listed_size
from stallscope.storage.obstore_client import list_tree, storage_error_text
from stallscope.storage.s3_request_plan import reader_name

logger = logging.getLogger(__name__)

S3_CONNECTIONS = 64  # open connections the client keeps, so requests in flight do not queue for one
# A transfer may take the timeout plus its bytes at this rate: a shard's upload is not cut off by the
# deadline of a small request, and a store slower than this past the timeout counts as not answering.
SLOWEST_BYTES_PER_S = 1 << 20

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
    """s3:// through fsspec/s3fs; one client per process, made on first use, with an event loop of its
    own: requests a failed run left behind (a pipeline's reads, retrying a store that went away) stay
    on the loop of the client they were made by, not on fsspec's shared one, where they held up the
    next client's requests."""

    def __init__(self) -> None:
        self._fs = None
        self._pid = 0
        self._lock = threading.Lock()
        self._objects: s3_obstore.ObjectReader | None = None

    def objects(self) -> s3_obstore.ObjectReader:
        """The obstore reader of whole objects (one per store; it remakes itself after a fork)."""
        with self._lock:
            if self._objects is None:
                self._objects = s3_obstore.ObjectReader(self._bucket_region)
            return self._objects

    def _bucket_region(self, bucket: str) -> str | None:
        """The bucket's region as S3 names it in a HEAD of the bucket (None where it cannot be had)."""
        seconds = operation_limit()
        try:
            found = self.fs().call_s3("head_bucket", Bucket=bucket, timeout=seconds)
            return found["ResponseMetadata"]["HTTPHeaders"].get("x-amz-bucket-region")
        except TimeoutError as exc:  # silent: the read it is made for would wait as long again
            if _is_deadline(exc):
                raise TimeoutError(f"no answer to a HEAD of bucket {bucket!r} in {seconds:.0f} s") from None
            return None
        except Exception:  # refused, missing or unreachable: the reads themselves then say so in one line
            return None

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
            raise UsageError(f"s3:// needs the s3fs package: {install_line('stores')}") from None
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
        except StorageError:
            raise
        except Exception as exc:  # botocore, aiohttp and OSError kinds: all one line
            raise self.error(path, exc, action) from None

    def _do(self, path: RemotePath, action: str, method: str, *args, nbytes: int = 0, **kwargs):
        """`fs.method(*args, **kwargs)` within `operation_limit(nbytes)`, retries included: fsspec
        cancels the request on the client's loop when the deadline passes (nothing is left waiting)."""
        fs = self.fs()
        return self._call(path, lambda: getattr(fs, method)(*args, timeout=operation_limit(nbytes), **kwargs), action)

    def list(self, root: RemotePath) -> Listing:
        """Every object under `root`, its folders listed several at a time (`list_by_folders`),
        folder placeholders ("a/") left out: through obstore where it is the reader (ImageNet train's
        1.28 million objects from the emulated store, listed and planned: 19 s of CPU, against 104 s
        through s3fs), else through s3fs."""
        fs = self.fs()
        if reader_name() == "obstore":
            try:
                files = list_tree(self.objects().store(root.bucket), root.key.strip("/"), str(root))
            except StorageError:
                raise
            except Exception as exc:  # obstore's failures, one line
                raise self.error(root, exc) from None
            if not files:
                self._do(root, "read", "ls", root.bucket, detail=False, refresh=True)  # NoSuchBucket, or refused, names itself
            logger.info("%s: listed %d objects", root, len(files))
            return Listing(root, files)
        key = f"{root.bucket}/{root.key}".rstrip("/")

        def folder(prefix: str) -> tuple[list, list[str]]:
            try:
                # no limit on the whole call: a folder of many pages may take longer, page by page; the
                # silence limit below ends a listing once the store stops answering
                entries = fs.ls(prefix, detail=True, refresh=True)
            except FileNotFoundError:  # nothing under the prefix
                return [], []
            return ([e for e in entries if e["type"] != "directory"],
                    [e["name"].rstrip("/") for e in entries if e["type"] == "directory"])

        files: dict[str, ObjectInfo] = {}

        def walk(heard: Callable[[], None]) -> None:
            for objects in list_by_folders(folder, key, heard):  # each folder's, kept as sizes and times only
                for info in objects:
                    modified = info.get("LastModified")
                    mtime = int(modified.timestamp() * 1e9) if isinstance(modified, datetime.datetime) else 0
                    files[info["name"][len(key):].lstrip("/")] = ObjectInfo(int(info.get("size") or info.get("Size") or 0), mtime)

        def probe() -> None:  # a HEAD the store answers, found, missing or refused, while a large folder is listed
            try:
                fs.call_s3("head_object", Bucket=root.bucket, Key=f"{root.key}/.stallscope-probe".lstrip("/"),
                           timeout=operation_limit())
            except (FileNotFoundError, PermissionError):
                pass

        # silent for the timeout: each page is one operation, so a silent store fails as one request does
        with_silence_limit(lambda heard: self._call(root, lambda: walk(heard)), operation_limit(), str(root), probe)
        if not files:
            self._do(root, "read", "ls", root.bucket, detail=False, refresh=True)  # NoSuchBucket, or refused, names itself
            return Listing(root, {})  # an empty prefix: it does not exist (yet)
        logger.info("%s: listed %d objects", root, len(files))
        return Listing(root, files)

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
        self._do(path, "write", "pipe_file", self._key(path), data, nbytes=len(data))

    def upload(self, local: Path, path: RemotePath) -> None:
        self._do(path, "write", "put_file", str(local), self._key(path), nbytes=local.stat().st_size)

    def rename(self, src: RemotePath, dst: RemotePath) -> None:
        # a copy and a delete, each with its deadline (fsspec's mv takes none: 3 minutes against a silent store)
        self._do(dst, "write", "cp_file", self._key(src), self._key(dst), nbytes=listed_size(src) or 0)
        self._do(src, "delete", "rm_file", self._key(src))

    def delete(self, path: RemotePath) -> None:
        self._do(path, "delete", "rm_file", self._key(path))
