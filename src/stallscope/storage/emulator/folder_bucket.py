"""A local folder seen as one bucket of an object store: keys, object stats, ranges and listings.

Both HTTP stores (GCS and S3 dialects) answer from here, so they agree on what exists: every regular
file under the folder is an object whose key is its relative path with '/' separators; folders are
not objects, and an empty folder does not exist (as in a real bucket). Keys that would leave the
folder ('..', absolute, through a link pointing outside) are not found.

A bucket made `writable` also takes whole objects (written beside their place under a hidden name,
then renamed, so a reader never sees half an object), deletes and copies. A folder object (`a/b/`,
as TF's gs:// makedirs writes) is kept as a hidden marker file in that folder.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from stat import S_ISREG
from typing import BinaryIO

DEFAULT_PAGE_SIZE = 1000
PART_PREFIX = ".stallscope-part-"  # an object being written: never listed, never an object
FOLDERS_REMEMBERED = 10_000  # resolved folders kept for object reads; forgotten all at once past this
FOLDER_MARKER = ".stallscope-folder"  # the file behind a folder object `a/b/` (what a gs:// makedirs writes)


@dataclasses.dataclass(frozen=True)
class StoredObject:
    """An object the bucket holds: its key, size and modification time (the client side's
    `storage.paths.ObjectInfo` is what a listing told a reader, without the key)."""

    key: str
    size: int
    mtime_ns: int

    def modified(self) -> str:
        """The modification time as both stores write it: RFC 3339 in UTC, to the millisecond (S3's
        LastModified, GCS's timeCreated and updated)."""
        moment = datetime.datetime.fromtimestamp(self.mtime_ns / 1e9, tz=datetime.timezone.utc)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclasses.dataclass(frozen=True)
class ListPage:
    """One page of a listing: objects, the common prefixes a delimiter folded, and the token that asks
    for the next page ('' on the last)."""

    objects: tuple[StoredObject, ...]
    prefixes: tuple[str, ...]
    next_token: str


class ByteRangeError(ValueError):
    """A Range header that asks for no byte of the object (answered 416)."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte, inclusive, of a `Range: bytes=...` header; None for the whole object.

    A malformed or multi-range header is ignored (the whole object, as HTTP allows); a range that
    starts past the end raises ByteRangeError."""
    if not header or not header.strip().lower().startswith("bytes="):
        return None
    spec = header.strip()[6:]
    if "," in spec or "-" not in spec:
        return None
    first_text, last_text = (part.strip() for part in spec.split("-", 1))
    try:
        if not first_text:  # the last N bytes
            count = int(last_text)
            if count <= 0:
                raise ByteRangeError(header)
            return max(0, size - count), size - 1
        first = int(first_text)
        last = int(last_text) if last_text else size - 1
    except ValueError:
        return None
    if first >= size or last < first:
        raise ByteRangeError(header)
    return first, min(last, size - 1)


class WriteRefused(ValueError):
    """A write the bucket does not take: it is read-only, or the key names no place for an object."""


class FolderBucket:
    """The objects of one folder; read-only unless `writable`."""

    def __init__(self, root: str | os.PathLike, name: str, *, writable: bool = False) -> None:
        self.root = Path(root).resolve()
        self._root_text = str(self.root)
        self._root_prefix = os.path.join(self._root_text, "")  # "/srv/data/": what every path inside starts with
        self.name = name
        self.writable = writable
        self._snapshots: OrderedDict[str, list] = OrderedDict()  # next-page token -> rest of a listing
        self._lock = threading.Lock()
        self._real_folders: dict[str, str] = {}  # a folder's path -> its resolved path (see _resolve)

    # ----- objects
    def _resolve(self, path: str) -> str:
        """`os.path.realpath(path)`, with the folders above it remembered: a read asks only whether the
        object itself is a link (one lstat) instead of resolving every folder up to / again (a dozen
        lstats, ~40% of the store's CPU per GET). A folder under the root swapped for a link while the
        store serves it is not noticed. Text, not Path: building Paths was ~20% of the CPU per GET."""
        parent, name = os.path.split(path)
        real_parent = self._real_folders.get(parent)
        if real_parent is None:
            real_parent = os.path.realpath(parent)
            if len(self._real_folders) >= FOLDERS_REMEMBERED:
                self._real_folders.clear()
            self._real_folders[parent] = real_parent
        if os.path.islink(path):
            return os.path.realpath(path)
        return os.path.join(real_parent, name)

    def _inside(self, key: str) -> tuple[Path, str] | None:
        """(path, resolved path as text) of `key` under the root, or None for a key that names no place
        inside it (empty parts, `..`, a link out of the folder)."""
        parts = key.split("/")
        if any(part in ("", ".", "..") for part in parts):
            return None
        path = os.path.join(self._root_text, *parts)
        try:
            resolved = self._resolve(path)
        except OSError:
            return None
        if resolved != self._root_text and not resolved.startswith(self._root_prefix):
            return None
        return Path(path), resolved

    def lookup(self, key: str) -> tuple[Path, StoredObject] | None:
        """The file behind `key` and its object's stat (one stat call), or None when no object has that key."""
        file_key = _file_key(key)
        if not file_key or file_key.startswith("/") or "\0" in file_key \
                or file_key.rpartition("/")[2].startswith(PART_PREFIX):
            return None
        found = self._inside(file_key)
        if found is None:
            return None
        try:
            status = found[0].stat()
        except OSError:
            return None
        if not S_ISREG(status.st_mode):
            return None
        return found[0], StoredObject(key, status.st_size, status.st_mtime_ns)

    def path_of(self, key: str) -> Path | None:
        """The file behind `key`, or None when no object has that key."""
        found = self.lookup(key)
        return found[0] if found is not None else None

    def stat(self, key: str) -> StoredObject | None:
        found = self.lookup(key)
        return found[1] if found is not None else None

    # ----- writes
    def _place_for(self, key: str) -> Path:
        if not self.writable:
            raise WriteRefused("this emulated store is read-only: start it with --writable to take writes")
        key = _file_key(key)
        found = self._inside(key) if key and "\0" not in key and not key.startswith("/") else None
        if found is None or found[0].name.startswith(PART_PREFIX) or found[0].is_dir():
            raise WriteRefused(f"no object can be written under the key {key!r} in this folder")
        return found[0]

    def open_part(self, key: str) -> tuple[Path, BinaryIO]:
        """A hidden file beside `key`'s place to write the object into; `commit` or `abandon` it."""
        target = self._place_for(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise WriteRefused(f"no object can be written under the key {key!r}: a parent is an object") from None
        handle = tempfile.NamedTemporaryFile(dir=target.parent, prefix=PART_PREFIX, delete=False)
        return Path(handle.name), handle

    def commit(self, key: str, part: Path) -> StoredObject:
        target = self._place_for(key)
        os.replace(part, target)
        status = target.stat()
        return StoredObject(key, status.st_size, status.st_mtime_ns)

    @staticmethod
    def abandon(part: Path) -> None:
        part.unlink(missing_ok=True)

    def put(self, key: str, data: bytes) -> StoredObject:
        part, handle = self.open_part(key)
        with handle:
            handle.write(data)
        return self.commit(key, part)

    def delete(self, key: str) -> bool:
        """Removes the object (and the folders it leaves empty); False when there was none."""
        self._place_for(key)
        path = self.path_of(key)
        if path is None:
            return False
        path.unlink()
        folder = path.parent
        while folder != self.root and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
        return True

    def copy(self, source_key: str, key: str) -> StoredObject | None:
        """`source_key`'s bytes as `key`; None when there is no such source."""
        source = self.path_of(source_key)
        if source is None:
            self._place_for(key)
            return None
        part, handle = self.open_part(key)
        with handle, open(source, "rb") as reading:
            shutil.copyfileobj(reading, handle, 1 << 20)
        return self.commit(key, part)

    # ----- listings
    def list(self, prefix: str = "", delimiter: str = "", token: str = "",
             page_size: int = DEFAULT_PAGE_SIZE) -> ListPage:
        """Keys starting with `prefix` in lexicographic order, folded at `delimiter` into common
        prefixes, `page_size` entries per page. A later page continues the snapshot the first page
        took (a listing of 50,000 files walks the folder once, not once per page)."""
        page_size = max(1, min(int(page_size or DEFAULT_PAGE_SIZE), DEFAULT_PAGE_SIZE))
        entries = self._take_snapshot(token) if token else None
        if entries is None:
            entries = self._entries(prefix, delimiter)
            if token:  # an unknown token (expired or made up): continue after it, as a key
                entries = [entry for entry in entries if _entry_key(entry) > token]
        page, rest = entries[:page_size], entries[page_size:]
        next_token = ""
        if rest:
            next_token = _entry_key(page[-1])
            with self._lock:
                self._snapshots[next_token] = rest
                while len(self._snapshots) > 64:
                    self._snapshots.popitem(last=False)
        return ListPage(
            objects=tuple(entry for entry in page if isinstance(entry, StoredObject)),
            prefixes=tuple(entry for entry in page if isinstance(entry, str)),
            next_token=next_token,
        )

    def _take_snapshot(self, token: str) -> list | None:
        with self._lock:
            return self._snapshots.pop(token, None)

    def _entries(self, prefix: str, delimiter: str) -> list:
        """Sorted objects (StoredObject) and common prefixes (str) for a listing."""
        if delimiter == "/":
            return self._one_level(prefix)
        entries: list = []
        folded: set[str] = set()
        for info in self._walk(prefix):
            rest = info.key[len(prefix):]
            if delimiter and delimiter in rest:
                folded.add(prefix + rest[: rest.index(delimiter) + len(delimiter)])
            else:
                entries.append(info)
        entries.extend(folded)
        return sorted(entries, key=_entry_key)

    def _walk(self, prefix: str):
        """Every object whose key starts with `prefix`, walking only the folder the prefix names."""
        folder_key, _, _ = prefix.rpartition("/")
        start = self.root.joinpath(*folder_key.split("/")) if folder_key else self.root
        if not start.is_dir() or (folder_key and self.path_of_folder(folder_key) is None):
            return
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            relative = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            base = "" if relative == "." else relative + "/"
            for name in filenames:
                if name.startswith(PART_PREFIX) or (name == FOLDER_MARKER and not base):
                    continue
                key = base if name == FOLDER_MARKER else base + name
                if key.startswith(prefix):
                    info = self._info(Path(dirpath) / name, key)
                    if info is not None:
                        yield info

    def _one_level(self, prefix: str) -> list:
        folder_key, _, stem = prefix.rpartition("/")
        folder = self.path_of_folder(folder_key) if folder_key else self.root
        if folder is None:
            return []
        base = folder_key + "/" if folder_key else ""
        entries: list = []
        try:
            scan = list(os.scandir(folder))
        except OSError:
            return []
        for entry in scan:
            if not entry.name.startswith(stem) or entry.name.startswith(PART_PREFIX):
                continue
            if entry.name == FOLDER_MARKER:
                if base and not stem:
                    info = self._info(Path(entry.path), base)
                    entries.extend([info] if info is not None else [])
                continue
            key = base + entry.name
            if entry.is_dir():
                if _holds_a_file(Path(entry.path)):
                    entries.append(key + "/")
            elif entry.is_file():
                info = self._info(Path(entry.path), key)
                if info is not None:
                    entries.append(info)
        return sorted(entries, key=_entry_key)

    def path_of_folder(self, folder_key: str) -> Path | None:
        found = self._inside(folder_key)
        if found is None or found[1] == self._root_text or not found[0].is_dir():
            return None
        return found[0]

    def _info(self, path: Path, key: str) -> StoredObject | None:
        try:
            if not self._resolve(str(path)).startswith(self._root_prefix):
                return None
            status = path.stat()
        except OSError:
            return None
        return StoredObject(key, status.st_size, status.st_mtime_ns)


def _file_key(key: str) -> str:
    """The key of the file behind an object: a folder object's marker file for `a/b/`."""
    return key + FOLDER_MARKER if key.endswith("/") and key.strip("/") else key


def _entry_key(entry) -> str:
    return entry.key if isinstance(entry, StoredObject) else entry


def _holds_a_file(folder: Path) -> bool:
    for _, _, filenames in os.walk(folder):
        if any(not name.startswith(PART_PREFIX) for name in filenames):
            return True
    return False


@dataclasses.dataclass(frozen=True)
class FileRange:
    """The bytes first..last (inclusive) of a file. Iterated, they are read in chunks; a server that can
    hand the file to the kernel (`os.sendfile`) sends them without reading them into Python."""

    path: Path
    first: int
    last: int
    chunk: int = 1 << 20

    def __iter__(self):
        with open(self.path, "rb") as handle:
            handle.seek(self.first)
            left = self.last - self.first + 1
            while left > 0:
                data = handle.read(min(self.chunk, left))
                if not data:
                    return
                left -= len(data)
                yield data


def read_range(path: Path, first: int, last: int, chunk: int = 1 << 20) -> FileRange:
    """The bytes first..last (inclusive) of a file, in chunks when iterated."""
    return FileRange(path, first, last, chunk)
