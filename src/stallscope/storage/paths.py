"""Paths and listings of the stores: `gs://bucket/prefix` and `s3://bucket/prefix` as `RemotePath`s, each
tree listed once (`Listing`, cached for the life of the process), and `Store`, what a store's client
does for them. Which client serves a scheme is `location`'s choice: it hands `backend` to
`serve_paths_with` when it loads, and every RemotePath reaches its store through it.

See `location` for the whole picture; this is its lower half, the part the stores' clients build on.
"""

from __future__ import annotations

import abc
import bisect
import concurrent.futures
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import ClassVar

from stallscope.errors import UsageError

SCHEMES = ("gs", "s3")


def is_remote(text: object) -> bool:
    return isinstance(text, RemotePath) or (isinstance(text, str) and text.split("://", 1)[0] in SCHEMES and "://" in text)


# --- paths ----------------------------------------------------------------------------------------


class RemotePath(PurePosixPath):
    """`scheme://bucket/key` held as the pure path `/bucket/key`; see `location`'s docstring."""

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
        yield from map(as_path, self.walk_file_texts())

    def walk_file_texts(self) -> Iterator[str]:
        """`walk_files` as text, `scheme://bucket/key`, with no RemotePath made for each object."""
        listing, rel = _listing_and_rel(self)
        base = str(listing.root)
        yield from (f"{base}/{name}" for name in listing.names_under(rel))

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
        return _store(self).read(self)

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
    _sorted: list[str] | None = dataclasses.field(default=None, init=False, repr=False)  # files' names, sorted

    def __post_init__(self) -> None:
        for name in self.files:
            if name:  # "" is the root itself, an object
                self._add_parents(name)

    def names_under(self, rel: str) -> list[str]:
        """The names of the objects below folder `rel`, sorted. The sorted names are kept until the
        listing changes, and a folder's are found by bisection: a walk of each of ImageNet's 1,000
        class folders sorted every one of its 1.28 million names a time (minutes, growing with the
        square of the tree)."""
        names = self._sorted
        if names is None:
            names = self._sorted = sorted(self.files)
        if not rel:
            return [name for name in names if name]  # "" is the root itself, an object
        # Every name that starts with "rel/" sorts from "rel/" to before "rel0" ("0" follows "/").
        return names[bisect.bisect_left(names, f"{rel}/"):bisect.bisect_left(names, f"{rel}0")]

    def _add_parents(self, name: str) -> None:
        parts = name.split("/")[:-1]
        for depth in range(len(parts)):
            self.dirs.add("/".join(parts[: depth + 1]))
        self.dirs.add("")

    def add(self, name: str, info: ObjectInfo) -> None:
        if name not in self.files:
            self._sorted = None
        self.files[name] = info
        if name:
            self._add_parents(name)

    def remove(self, name: str) -> None:
        if self.files.pop(name, None) is not None:
            self._sorted = None

    def children(self, rel: str) -> list[str]:
        start = f"{rel}/" if rel else ""
        names = {n[len(start):].split("/", 1)[0] for n in (*self.files, *self.dirs) if n.startswith(start) and n != rel and n}
        return sorted(names)


_LISTINGS: dict[RemotePath, Listing] = {}
_LOCK = threading.RLock()


def _cached_listing(path: RemotePath | str) -> tuple[Listing, str] | None:
    """The held listing whose root is `path` or above it, and `path` relative to that root. Compared as
    text (`scheme://bucket/key`, normalised as every RemotePath is, the scheme included): a stat of each
    of a million listed objects went through pathlib's parents and relative_to, twice a file in a scan."""
    text = str(path)
    with _LOCK:
        for root, listing in _LISTINGS.items():
            base = str(root)
            if text == base:
                return listing, ""
            if text.startswith(base) and text[len(base)] == "/":
                return listing, text[len(base) + 1:]
    return None


def _listing_and_rel(path: RemotePath) -> tuple[Listing, str]:
    """The cached listing covering `path`, else a new listing of `path` itself. The store is asked
    outside the lock: a listing that waits on a slow or dead store (up to --storage-timeout, with
    retries) must not hold up every other lookup, nor a later run's listing in the same process."""
    cached = _cached_listing(path)
    if cached is not None:
        return cached
    listing = _store(path).list(path)
    with _LOCK:
        cached = _cached_listing(path)  # another thread listed it meanwhile: keep the one all see
        if cached is not None:
            return cached
        _LISTINGS[path] = listing
        return listing, ""


def _lookup(path: RemotePath) -> "ObjectInfo | str | None":
    listing, rel = _listing_and_rel(path)
    if rel in listing.files:
        return listing.files[rel]
    return _DIR if rel in listing.dirs else None


def listed_info(path: RemotePath | str) -> ObjectInfo | None:
    """The object's size and time as a listing this process already holds says, without asking the
    store; None when no held listing covers it. The object may be named by its text, `scheme://bucket/key`
    as `RemotePath.walk_file_texts` gives it: no RemotePath made for each of a million objects."""
    cached = _cached_listing(path)
    if cached is None:
        return None
    info = cached[0].files.get(cached[1])
    return info if isinstance(info, ObjectInfo) else None


def listed_size(path: RemotePath) -> int | None:
    """The object's size as a listing this process already holds says; None when none covers it."""
    info = listed_info(path)
    return info.size if info is not None else None


def forget_listings() -> None:
    """Drops cached listings (tests; a long-lived process that must see new objects)."""
    with _LOCK:
        _LISTINGS.clear()


def record_change(path: RemotePath, info: ObjectInfo | None) -> None:
    """Keeps a cached listing that covers `path` in step with a write or delete through this module."""
    with _LOCK:
        for root, listing in _LISTINGS.items():
            if type(root) is type(path) and (root == path or root in path.parents):
                name = path.relative_to(root).as_posix() if root != path else ""
                listing.add(name, info) if info is not None else listing.remove(name)


# Folders of a tree listed at once (`list_by_folders`); each is one chain of pages.
FOLDERS_IN_FLIGHT = 16


def list_by_folders(list_folder: Callable[[str], tuple[list, list[str]]], top: str,
                    heard: Callable[[], None]) -> Iterator[list]:
    """Every object below the folder `top`, one folder at a time: `list_folder(prefix)` gives a
    folder's objects and its subfolders' prefixes (a listing with a delimiter, paged by the client),
    FOLDERS_IN_FLIGHT folders are listed at once, and each folder's objects are yielded as they come in,
    with `heard()` called. A flat listing is one chain of pages, each asked for when the one before is
    in: ImageNet train's 1,282 pages at a bucket's 50-100 ms a page take minutes, its 1,000 class
    folders listed 16 at a time a tenth of that."""
    with concurrent.futures.ThreadPoolExecutor(FOLDERS_IN_FLIGHT, thread_name_prefix="storage-list") as pool:
        running = {pool.submit(list_folder, top)}
        try:
            while running:
                done, running = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    objects, folders = future.result()
                    heard()
                    running.update(pool.submit(list_folder, folder) for folder in folders)
                    yield objects
        finally:
            for future in running:
                future.cancel()


class Store(abc.ABC):
    """What a store's client does for this module; see gcs_store.py and s3_store.py."""

    @abc.abstractmethod
    def list(self, root: RemotePath) -> Listing:
        ...

    @abc.abstractmethod
    def read(self, path: RemotePath) -> bytes:
        ...

    def read_many(self, paths: list[RemotePath], in_flight: int) -> list[bytes]:
        with concurrent.futures.ThreadPoolExecutor(max(1, in_flight)) as pool:
            return list(pool.map(self.read, paths))

    @abc.abstractmethod
    def write(self, path: RemotePath, data: bytes) -> None:
        ...

    @abc.abstractmethod
    def upload(self, local: Path, path: RemotePath) -> None:
        ...

    @abc.abstractmethod
    def rename(self, src: RemotePath, dst: RemotePath) -> None:
        ...

    @abc.abstractmethod
    def delete(self, path: RemotePath) -> None:
        ...


# How a RemotePath reaches its store's client: `location.backend`, handed over when location loads.
_store_of: list[Callable[[RemotePath], Store]] = []


def serve_paths_with(store_of: Callable[[RemotePath], Store]) -> None:
    """Sets the function that gives a path's store client (`location` does, with its `backend`)."""
    _store_of[:] = [store_of]


def _store(path: RemotePath) -> Store:
    if not _store_of:
        raise RuntimeError("no store client for remote paths: import stallscope.storage.location, "
                           "which picks one per scheme")
    return _store_of[0](path)
