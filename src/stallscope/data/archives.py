"""Reading tar archives in order and placing their files safely: what the ILSVRC2012 preparers share.

A member is written under a temporary name beside its target and renamed into place with the
member's time, so a killed run leaves no half file and the next run knows a finished file by its
size and time. A damaged or cut archive is never taken for a whole one (`checked_tarinfo`).
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from stallscope.errors import UsageError
from stallscope.storage.mounts import NetworkGuard

CHUNK = 1 << 20
# What a broken archive raises while it is read: tarfile's own errors, a cut gzip, a failing disk.
DAMAGE = (tarfile.TarError, EOFError, zlib.error, OSError)

# Called as progress(amount, total, unit): unit "B" for archives (bytes read), "file" for a folder.
ProgressSink = Callable[[int, "int | None", str], None]


class PositionReader:
    """A seekable archive file that reports progress by how far into it reading has come: a member
    passed over by a seek (a file already in place) counts as read."""

    def __init__(self, raw: IO[bytes], progress: ProgressSink | None, total: int | None):
        self._raw, self._progress, self._total = raw, progress, total
        self._reached = raw.tell()

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        if self._progress:
            position = self._raw.tell()
            if position > self._reached:
                self._progress(position - self._reached, self._total, "B")
                self._reached = position
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


def open_archive(fileobj: IO[bytes], problems: list[Exception], *, seekable: bool = True) -> tuple[tarfile.TarFile, bool]:
    """A tar archive and whether it was opened for random access. A plain tar in a seekable file is
    (a member already in place is passed over by a seek, not read); a compressed one, or one inside a
    stream, is read as a stream (a seek back in gzip would start it over). `problems` collects damaged
    headers (`checked_tarinfo`). Raises ReadError with a one-line reason where tarfile's lists every
    compression it tried."""
    if seekable:
        try:
            return tarfile.open(fileobj=fileobj, mode="r:", tarinfo=checked_tarinfo(problems)), True
        except tarfile.ReadError:
            fileobj.seek(0)
            problems.clear()  # what the plain reading met in a compressed file's bytes
    try:
        return tarfile.open(fileobj=fileobj, mode="r|*", tarinfo=checked_tarinfo(problems)), False
    except tarfile.ReadError:
        raise tarfile.ReadError("not a tar archive, plain or compressed (gz, bz2, xz)") from None


def members(archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The archive's members in order, none kept: a TarFile keeps every member it has read (about
    0.5 KB each), which a class archive of a million files would make 500 MB."""
    while (member := archive.next()) is not None:
        archive.members.clear()
        yield member


def checked_tarinfo(problems: list[Exception]) -> type[tarfile.TarInfo]:
    """tarfile ends a stream quietly at a cut or damaged header after the first member, as if the
    archive ended there; this TarInfo records that, so a damaged archive is never taken as whole."""

    class CheckedTarInfo(tarfile.TarInfo):
        @classmethod
        def fromtarfile(cls, archive):
            try:
                return super().fromtarfile(archive)
            except tarfile.EOFHeaderError:  # the zero block that ends a whole archive
                raise
            except tarfile.HeaderError as exc:
                problems.append(exc)
                raise

    return CheckedTarInfo


def tmp_path(target: Path) -> Path:
    """Where `target` is written before it is renamed into place: hidden, and named by this process."""
    return target.with_name(f".{target.name}.tmp-{os.getpid()}")


def is_tmp_name(name: str) -> bool:
    """A temporary of `tmp_path`'s making (left by a killed run)."""
    stem, dot, pid = name.rpartition(".tmp-")
    return name.startswith(".") and bool(dot) and len(stem) > 1 and pid.isdigit()


def same_file_data(target: Path, size: int, mtime: float) -> bool:
    """A finished file from an earlier run: same size and modification time as its source."""
    try:
        stat = target.stat()
    except OSError:
        return False
    return stat.st_size == size and int(stat.st_mtime) == int(mtime)


@contextlib.contextmanager
def writing(target: Path) -> Iterator[None]:
    """A failure to write `target` (a full disk, a read-only folder) is the output's, one clear line:
    never taken for damage in the archive being read."""
    try:
        yield
    except OSError as exc:
        raise UsageError(f"--output: cannot write {str(target)!r} ({exc.strerror or exc}); "
                         "expected a writable directory with room for the images") from None


def place_member(data: IO[bytes], head: bytes, mtime: float, target: Path, buffer: bytearray | None = None) -> None:
    """Streams a member (its first bytes `head` already read) to a temporary name beside `target`
    (whose folder exists), gives it the member's time, then renames it into place. `buffer`, reused
    from call to call, spares a fresh megabyte for every file. A read error is the archive's (OSError
    and tarfile's); a write error the output's (`writing`)."""
    view = memoryview(buffer if buffer is not None else bytearray(CHUNK))
    tmp = tmp_path(target)
    try:
        with writing(target):
            out = open(tmp, "wb", buffering=0)
        with out:
            view[: len(head)] = head
            filled = len(head) + data.readinto(view[len(head):])
            while filled:
                with writing(target):
                    out.write(view[:filled])
                filled = data.readinto(view)
        with writing(target):
            os.utime(tmp, (mtime, mtime))
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def make_output(output: Path) -> Path | None:
    """Creates the output folder for the synset folders; returns the outermost folder this made, for
    `remove_empty_created` after a failed run."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output: {str(output)!r} is a file; expected a directory for the synset folders")
    first_created = first_missing(output)
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--output: cannot write {str(output)!r} ({exc.strerror or exc.__class__.__name__}); expected a writable directory") from None
    return first_created


def network_guard(source: Path, output: Path) -> NetworkGuard:
    """Where the output (or else the source) is on a network file system, prepare's steps there are
    bounded: a server that stops answering ends the run in one line naming --output or SOURCE, where a
    write or read on the main thread would have waited for ever (`storage/mounts.py`)."""
    guard = NetworkGuard.of(output, "--output")
    return guard if guard.fstype else NetworkGuard.of(source, "SOURCE")


def first_missing(path: Path) -> Path | None:
    """The outermost folder of `path` that does not exist yet: what `mkdir(parents=True)` will create."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def remove_empty_created(output: Path, first_created: Path | None) -> None:
    """After a failed run: removes the folders this run created, only where they are still empty."""
    if first_created is None:
        return
    for dirpath, _, _ in os.walk(output, topdown=False):  # innermost first
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
    for folder in (output, *output.parents):
        if not (folder == first_created or first_created in folder.parents):
            break
        with contextlib.suppress(OSError):
            folder.rmdir()
