"""Data locations: a local path, `gs://bucket/prefix` or `s3://bucket/prefix`, behind one path type.

`as_path(text)` gives a `pathlib.Path` for a local path and a `RemotePath` for a URL. A `RemotePath` is
a pure POSIX path (so `/`, `.name`, `.suffix`, `.parent` and `relative_to` work as on a `Path`) whose
`exists`, `is_dir`, `iterdir` and `stat` answer from one recursive listing of its root, made on first
use and kept for the life of the process: a tree is listed once per run, not per epoch or per question.
Bytes go through each store's own client: gs:// through TensorFlow's file system (`tf.io.gfile`, built
into TF 2.21), s3:// through fsspec/s3fs (TF 2.21 has no s3://). Credentials come from each store's
usual environment (Application Default Credentials for gs://; AWS_* variables, ~/.aws or
AWS_ENDPOINT_URL for s3://).

Whatever goes wrong with a store (no or refused credentials, a missing bucket or prefix, a store that
does not answer) is a `StorageError`: one line, raised within the storage timeout.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import ClassVar, TypeVar

from stallscope.errors import UsageError

logger = logging.getLogger(__name__)

SCHEMES = ("gs", "s3")
DEFAULT_TIMEOUT_S = 30.0
# Requests one listing keeps in flight where the store needs one request per object (gs:// stat).
LIST_IN_FLIGHT = 32
MAX_DEPTH = 16  # folder levels a gs:// listing descends
S3_CONNECTIONS = 64  # open connections the s3:// client keeps, so requests in flight do not queue for one
# TF's gs:// client retries a failed request this many times (its own default is 10, with back-off up
# to 32 s: minutes before a dead store is reported).
GCS_RETRIES = 2
GCS_BLOCK_VAR = "GCS_READ_CACHE_BLOCK_SIZE_MB"
# TF's gs:// gives every opened object a read buffer of this many MB (64 by default: ~46 ms of CPU per
# small object). One MB holds a typical JPEG in one request.
SMALL_OBJECT_BLOCK_MB = 1

T = TypeVar("T")


class StorageError(UsageError):
    """A store cannot be reached or refuses: one line naming the location and what was expected."""


_settings: dict = {"timeout_s": DEFAULT_TIMEOUT_S, "gcs_set": set()}  # gcs_set: TF variables we set


def set_timeout(seconds: float) -> None:
    """Connect and read timeout for every store request from now on (s3:// at once; gs:// needs
    `prepare_gcs_environment` before TensorFlow loads)."""
    if not seconds > 0:
        raise UsageError(f"--storage-timeout: expected a number of seconds above 0, got {seconds!r}")
    _settings["timeout_s"] = float(seconds)
    _S3.reset()


def storage_timeout() -> float:
    return _settings["timeout_s"]


def is_remote(text: object) -> bool:
    return isinstance(text, RemotePath) or (isinstance(text, str) and text.split("://", 1)[0] in SCHEMES and "://" in text)


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
            _settings["gcs_set"].add(name)
            set_now.append(f"{name}={value}")
    if set_now and "tensorflow" in sys.modules:
        logger.warning("TensorFlow was loaded before the gs:// settings %s; they apply from the next process", set_now)
    return set_now


def gcs_block_note() -> str:
    """TF's gs:// read block here, and who set it, for the run record."""
    value = os.environ.get(GCS_BLOCK_VAR)
    if not value:
        return f"{GCS_BLOCK_VAR} unset: a 64 MB buffer per object"
    return f"{GCS_BLOCK_VAR}={value}" + (", set by stallscope" if GCS_BLOCK_VAR in _settings["gcs_set"] else "")


# --- paths ----------------------------------------------------------------------------------------


class RemotePath(PurePosixPath):
    """`scheme://bucket/key` held as the pure path `/bucket/key`; see the module docstring."""

    scheme: ClassVar[str] = ""

    def __str__(self) -> str:
        text = super().__str__()
        return f"{self.scheme}:/{text}" if text.startswith("/") else text

    def __fspath__(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and super().__eq__(other)

    def __hash__(self) -> int:
        return hash((self.scheme, super().__hash__()))

    @property
    def bucket(self) -> str:
        return self.parts[1] if len(self.parts) > 1 else ""

    @property
    def key(self) -> str:
        return "/".join(self.parts[2:])

    def resolve(self) -> "RemotePath":
        return self

    def absolute(self) -> "RemotePath":
        return self

    def exists(self) -> bool:
        return _lookup(self) is not None

    def is_dir(self) -> bool:
        return _lookup(self) == _DIR

    def is_file(self) -> bool:
        return isinstance(_lookup(self), ObjectInfo)

    def is_symlink(self) -> bool:
        return False

    def iterdir(self) -> Iterator["RemotePath"]:
        listing, rel = _listing_and_rel(self)
        yield from (self / name for name in listing.children(rel))

    def walk_files(self) -> Iterator["RemotePath"]:
        """Every object below this folder, sorted."""
        listing, rel = _listing_and_rel(self)
        start = f"{rel}/" if rel else ""
        yield from (listing.root / name for name in sorted(listing.files) if name.startswith(start) and name != rel)

    def stat(self) -> os.stat_result:
        info = _lookup(self)
        if not isinstance(info, ObjectInfo):
            raise FileNotFoundError(2, "no such object", str(self))
        seconds = info.mtime_ns // 10**9
        # (mode, ino, dev, nlink, uid, gid, size, atime, mtime, ctime, the three as floats, then in ns)
        return os.stat_result((0o100644, 0, 0, 1, 0, 0, info.size, seconds, seconds, seconds,
                               info.mtime_ns / 1e9, info.mtime_ns / 1e9, info.mtime_ns / 1e9,
                               info.mtime_ns, info.mtime_ns, info.mtime_ns))

    def read_bytes(self) -> bytes:
        """The object's bytes; FileNotFoundError, as for a local file, when the listing has no such object."""
        if not isinstance(_lookup(self), ObjectInfo):
            raise FileNotFoundError(2, "no such object", str(self))
        return backend(self).read(self)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)


class GsPath(RemotePath):
    scheme = "gs"


class S3Path(RemotePath):
    scheme = "s3"


_PATH_TYPES = {"gs": GsPath, "s3": S3Path}


def as_path(value: "str | os.PathLike[str]") -> "Path | RemotePath":
    """A `RemotePath` for `gs://` or `s3://`, a `Path` for anything else; `RemotePath`s pass through."""
    if isinstance(value, (RemotePath, Path)):
        return value
    text = os.fspath(value)
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in _PATH_TYPES:
        if sep:
            raise UsageError(f"{text!r}: expected a local path, gs://bucket/prefix or s3://bucket/prefix, got a {scheme}:// URL")
        return Path(text)
    bucket = rest.split("/", 1)[0]
    if not bucket:
        raise UsageError(f"{text!r}: expected {scheme}://BUCKET/prefix, got no bucket")
    return _PATH_TYPES[scheme]("/" + rest.rstrip("/"))


# --- listings -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    size: int
    mtime_ns: int


_DIR = "dir"


@dataclasses.dataclass
class Listing:
    """Every object under `root` (keys relative to it) and the folders their keys imply."""

    root: RemotePath
    files: dict[str, ObjectInfo]
    dirs: set[str] = dataclasses.field(default_factory=set)

    def __post_init__(self) -> None:
        for name in self.files:
            if name:  # "" is the root itself, an object
                self._add_parents(name)

    def _add_parents(self, name: str) -> None:
        parts = name.split("/")[:-1]
        for depth in range(len(parts)):
            self.dirs.add("/".join(parts[: depth + 1]))
        self.dirs.add("")

    def add(self, name: str, info: ObjectInfo) -> None:
        self.files[name] = info
        if name:
            self._add_parents(name)

    def remove(self, name: str) -> None:
        self.files.pop(name, None)

    def children(self, rel: str) -> list[str]:
        start = f"{rel}/" if rel else ""
        names = {n[len(start):].split("/", 1)[0] for n in (*self.files, *self.dirs) if n.startswith(start) and n != rel and n}
        return sorted(names)


_LISTINGS: dict[RemotePath, Listing] = {}
_LOCK = threading.RLock()


def _listing_and_rel(path: RemotePath) -> tuple[Listing, str]:
    with _LOCK:
        for root, listing in _LISTINGS.items():
            if type(root) is type(path) and (root == path or root in path.parents):
                return listing, path.relative_to(root).as_posix() if root != path else ""
        listing = backend(path).list(path)
        _LISTINGS[path] = listing
        return listing, ""


def _lookup(path: RemotePath) -> "ObjectInfo | str | None":
    listing, rel = _listing_and_rel(path)
    if rel in listing.files:
        return listing.files[rel]
    return _DIR if rel in listing.dirs else None


def forget_listings() -> None:
    """Drops cached listings (tests; a long-lived process that must see new objects)."""
    with _LOCK:
        _LISTINGS.clear()


def _record(path: RemotePath, info: ObjectInfo | None) -> None:
    """Keeps a cached listing that covers `path` in step with a write or delete through this module."""
    with _LOCK:
        for root, listing in _LISTINGS.items():
            if type(root) is type(path) and (root == path or root in path.parents):
                name = path.relative_to(root).as_posix() if root != path else ""
                listing.add(name, info) if info is not None else listing.remove(name)


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
    _record(path, ObjectInfo(len(data), 0))


def upload_file(local: Path, path: RemotePath) -> None:
    """Copies a local file to `path` under a temporary name, then renames it."""
    store = backend(path)
    tmp = temporary_name(path)
    store.upload(local, tmp)
    store.rename(tmp, path)
    _record(path, ObjectInfo(local.stat().st_size, 0))


def delete(path: RemotePath) -> None:
    backend(path).delete(path)
    _record(path, None)


def backend(path: RemotePath) -> "_Store":
    return _GCS if path.scheme == "gs" else _S3


def abandoned_requests() -> bool:
    """True once a request was given up by `with_deadline`: its thread still waits inside the store's
    client, and a normal interpreter exit would tear TF's C++ down under it (an abort). The CLI then
    ends the process with `os._exit` after printing its line."""
    return bool(_settings.get("abandoned"))


def with_deadline(fn: Callable[[], T], seconds: float, what: str) -> T:
    """`fn()`, or a StorageError when it has not returned within `seconds` (it runs on in a daemon
    thread; see `abandoned_requests`)."""
    box: dict[str, object] = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=call, name="storage-deadline", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        _settings["abandoned"] = True
        raise StorageError(f"{what}: the store did not answer within {seconds:.0f} s (--storage-timeout); expected a store that answers")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


class _Store:
    def list(self, root: RemotePath) -> Listing:
        raise NotImplementedError

    def read(self, path: RemotePath) -> bytes:
        raise NotImplementedError

    def read_many(self, paths: list[RemotePath], in_flight: int) -> list[bytes]:
        with concurrent.futures.ThreadPoolExecutor(max(1, in_flight)) as pool:
            return list(pool.map(self.read, paths))

    def write(self, path: RemotePath, data: bytes) -> None:
        raise NotImplementedError

    def upload(self, local: Path, path: RemotePath) -> None:
        raise NotImplementedError

    def rename(self, src: RemotePath, dst: RemotePath) -> None:
        raise NotImplementedError

    def delete(self, path: RemotePath) -> None:
        raise NotImplementedError


def _deadline() -> float:
    """How long the first request of a listing may take before the store is called silent: the
    timeout plus a margin for the client's own connect/read timeouts to report first."""
    return storage_timeout() + 5.0


class _GcsStore(_Store):
    """gs:// through TensorFlow's own GCS file system."""

    @staticmethod
    def _tf():
        from stallscope.tfimport import import_tensorflow

        return import_tensorflow()

    def _errors(self, path: RemotePath, exc: Exception) -> StorageError:
        tf = self._tf()
        text = " ".join(str(exc).split())
        curl = re.search(r"libcurl code \d+ meaning '[^']*'", text)
        text = curl.group(0) if curl else text
        if isinstance(exc, (tf.errors.UnauthenticatedError, tf.errors.PermissionDeniedError)) or " 401" in text or " 403" in text:
            return StorageError(f"{path}: gs:// refused the credentials ({_short(text)}); expected Application Default "
                                "Credentials (GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`) "
                                "that may read this bucket")
        if "libcurl" in text or isinstance(exc, (tf.errors.AbortedError, tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
            return StorageError(f"{path}: the store did not answer ({_short(text)}); expected a reachable "
                                "storage.googleapis.com (or HTTPS_PROXY) within --storage-timeout")
        return StorageError(f"{path}: gs:// failed ({_short(text)})")

    def _call(self, path: RemotePath, fn: Callable[[], T]) -> T:
        tf = self._tf()
        try:
            return fn()
        except tf.errors.OpError as exc:
            raise self._errors(path, exc) from None

    def list(self, root: RemotePath) -> Listing:
        tf = self._tf()
        url = str(root)
        exists = with_deadline(lambda: self._call(root, lambda: tf.io.gfile.exists(url)), _deadline(), str(root))
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
        tf = self._tf()

        def read() -> bytes:
            with tf.io.gfile.GFile(str(path), "rb") as handle:
                return handle.read()

        return self._call(path, read)

    def write(self, path: RemotePath, data: bytes) -> None:
        tf = self._tf()

        def write() -> None:
            with tf.io.gfile.GFile(str(path), "wb") as handle:
                handle.write(data)

        self._call(path, write)

    def upload(self, local: Path, path: RemotePath) -> None:
        tf = self._tf()
        self._call(path, lambda: tf.io.gfile.copy(str(local), str(path), overwrite=True))

    def rename(self, src: RemotePath, dst: RemotePath) -> None:
        tf = self._tf()
        self._call(dst, lambda: tf.io.gfile.rename(str(src), str(dst), overwrite=True))

    def delete(self, path: RemotePath) -> None:
        tf = self._tf()
        self._call(path, lambda: tf.io.gfile.remove(str(path)))


class _S3Store(_Store):
    """s3:// through fsspec/s3fs; one client per process, made on first use."""

    def __init__(self) -> None:
        self._fs = None
        self._pid = 0

    def reset(self) -> None:
        self._fs = None

    def fs(self):
        if self._fs is None or self._pid != os.getpid():
            try:
                import s3fs
            except ImportError:
                raise UsageError("s3:// needs the s3fs package: pip install 'stallscope[storage]'") from None
            seconds = storage_timeout()
            self._fs = s3fs.S3FileSystem(
                skip_instance_cache=True,
                config_kwargs={"connect_timeout": seconds, "read_timeout": seconds,
                               "retries": {"max_attempts": 2, "mode": "standard"},
                               # botocore's pool holds 10 connections: fewer than a pipeline keeps in flight
                               "max_pool_connections": S3_CONNECTIONS},
            )
            self._fs.retries = 2  # s3fs's own retries of dropped connections (5 by default)
            self._pid = os.getpid()
        return self._fs

    def _error(self, path: RemotePath, exc: BaseException) -> StorageError:
        name = type(exc).__name__
        text = " ".join(str(exc).split())
        cause = exc.__cause__ or exc.__context__
        code = ""
        for candidate in (exc, cause):
            response = getattr(candidate, "response", None)
            if isinstance(response, dict):
                code = response.get("Error", {}).get("Code", "") or code
        if name in ("NoCredentialsError", "PartialCredentialsError") or "Unable to locate credentials" in text:
            return StorageError(f"{path}: no credentials for s3://; expected AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "AccessDenied") \
                or isinstance(exc, PermissionError):
            why = code or _short(text)
            return StorageError(f"{path}: s3:// refused the credentials ({why}); expected AWS credentials that may read this bucket")
        if code == "NoSuchBucket" or "NoSuchBucket" in text or "bucket does not exist" in text.lower():
            return StorageError(f"{path}: bucket {path.bucket!r} does not exist; expected an existing bucket")
        if any(word in name for word in ("Endpoint", "Timeout", "Connect", "ClientOSError", "ServerDisconnected")) \
                or "connect" in text.lower() or "timeout" in text.lower() or isinstance(exc, (TimeoutError, ConnectionError)):
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the S3 endpoint"
            return StorageError(f"{path}: the store at {endpoint} did not answer ({_short(text)}); "
                                "expected a reachable S3 endpoint within --storage-timeout")
        if isinstance(exc, FileNotFoundError):
            return StorageError(f"{path}: no such object or prefix; expected one that exists")
        return StorageError(f"{path}: s3:// failed ({name}: {_short(text)})")

    def _call(self, path: RemotePath, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except StorageError:
            raise
        except Exception as exc:  # botocore, aiohttp and OSError kinds: all one line
            raise self._error(path, exc) from None

    def list(self, root: RemotePath) -> Listing:
        fs = self.fs()
        key = f"{root.bucket}/{root.key}".rstrip("/")

        def find() -> dict:
            return fs.find(key, detail=True, withdirs=False)

        found = with_deadline(lambda: self._call(root, find), _deadline(), str(root))
        if not found:
            self._call(root, lambda: fs.ls(root.bucket, detail=False, refresh=True))  # NoSuchBucket, or refused, names itself
            return Listing(root, {})  # an empty prefix: it does not exist (yet)
        files = {}
        for name, info in found.items():
            rel = name[len(key):].lstrip("/")
            modified = info.get("LastModified")
            mtime = int(modified.timestamp() * 1e9) if isinstance(modified, datetime.datetime) else 0
            files[rel] = ObjectInfo(int(info.get("size") or info.get("Size") or 0), mtime)
        logger.info("%s: listed %d objects", root, len(files))
        return Listing(root, files)

    def _key(self, path: RemotePath) -> str:
        return f"{path.bucket}/{path.key}"

    def read(self, path: RemotePath) -> bytes:
        return self._call(path, lambda: self.fs().cat_file(self._key(path)))

    def read_many(self, paths: list[RemotePath], in_flight: int) -> list[bytes]:
        keys = [self._key(p) for p in paths]
        found = self._call(paths[0], lambda: self.fs().cat(keys, batch_size=max(1, in_flight), on_error="return"))
        out = []
        for path, key in zip(paths, keys):
            value = found.get(key)
            if isinstance(value, BaseException) or value is None:
                raise self._error(path, value or FileNotFoundError(key))
            out.append(value)
        return out

    def write(self, path: RemotePath, data: bytes) -> None:
        self._call(path, lambda: self.fs().pipe_file(self._key(path), data))

    def upload(self, local: Path, path: RemotePath) -> None:
        self._call(path, lambda: self.fs().put_file(str(local), self._key(path)))

    def rename(self, src: RemotePath, dst: RemotePath) -> None:
        self._call(dst, lambda: self.fs().mv(self._key(src), self._key(dst)))

    def delete(self, path: RemotePath) -> None:
        self._call(path, lambda: self.fs().rm_file(self._key(path)))


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_GCS = _GcsStore()
_S3 = _S3Store()


