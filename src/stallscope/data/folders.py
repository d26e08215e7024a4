"""Scanning `{label}/*` and `{split}/{label}/*` image trees into labelled file lists.

The scan accounts for every regular file under the root: a file in a class folder becomes a
candidate (its content is judged later, by `images.py`); anything else is listed with the reason
it cannot be used. Listings are sorted so that runs repeat.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from stallscope.errors import DataError, UsageError
from stallscope.storage.location import RemotePath, as_path
from stallscope.storage.mounts import NetworkGuard, Ticks

log = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "validation", "val", "test", "eval")
DEFAULT_SPLIT = "train"
# Index files a data set keeps at its root or a split's (the built-in data set's synthetic.json, the
# report `prepare imagenet-val` and `imagenet-train` leave beside the synset folders): not images and
# not a user's stray files, so they are recorded with their own reason rather than reported as skipped.
DATASET_INDEX_FILES = ("synthetic.json", "prepare.json")
DATASET_INDEX = "the data set's own index"
# A class folder without a file in it is no label, unless a labels file names it (SkippedFile reason).
EMPTY_CLASS_FOLDER = "empty class folder (not a label)"


def _is_dataset_index(entry) -> bool:
    return entry.name in DATASET_INDEX_FILES and entry.is_file() and not entry.is_symlink()


@dataclasses.dataclass(frozen=True)
class ImageFile:
    path: Path
    split: str
    label: int
    label_text: str


@dataclasses.dataclass(frozen=True)
class SkippedFile:
    path: Path
    reason: str


@dataclasses.dataclass(frozen=True)
class FolderTree:
    root: Path
    labels: tuple[str, ...]
    files: tuple[ImageFile, ...]
    skipped: tuple[SkippedFile, ...]
    has_splits: bool

    @property
    def splits(self) -> tuple[str, ...]:
        return ordered_splits({f.split for f in self.files})

    def split_files(self, split: str) -> tuple[ImageFile, ...]:
        return tuple(f for f in self.files if f.split == split)


def ordered_splits(names: Iterable[str]) -> tuple[str, ...]:
    """Split names in the order reports list them: train, validation, ... first, then the rest by name."""
    return tuple(sorted(names, key=_split_order))


def _split_order(name: str) -> tuple[int, str]:
    return (SPLIT_NAMES.index(name) if name in SPLIT_NAMES else len(SPLIT_NAMES), name)


def read_text_file(path: Path, flag: str, expected: str) -> str:
    """The text of a UTF-8 file the user named with `flag`; any reason it cannot be read is one line
    naming the flag, the path and `expected` (what the file should hold)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{flag}: file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{flag}: {str(path)!r} is a directory; expected a text file with {expected}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag}: {str(path)!r} is not a UTF-8 text file; expected {expected}") from None
    except OSError as exc:  # permission denied, a path through a file, ...
        raise UsageError(f"{flag}: cannot read {str(path)!r} ({exc.strerror or exc})") from None


def read_labels_file(path: Path) -> tuple[str, ...]:
    """One label per line (blank lines and `#` comments ignored); the line order is the index."""
    lines = read_text_file(path, "--labels", "one label per line").splitlines()
    labels = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not labels:
        raise UsageError(f"--labels: {str(path)!r} holds no labels; expected one label per line")
    duplicates = sorted(label for label, n in Counter(labels).items() if n > 1)
    if duplicates:
        raise UsageError(f"--labels: {str(path)!r} lists {duplicates[0]!r} more than once")
    return tuple(labels)


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


UNREADABLE_FOLDER = "unreadable folder"


def _walk_files(folder: Path, unreadable: list[SkippedFile], hidden: bool = False,
                as_text: bool = False) -> Iterator[tuple[Path | str, str | None]]:
    """Every non-directory entry below `folder` with the reason it cannot be used when its directory
    entry alone tells (None: a candidate), in os.walk's order (a folder's files sorted, then its links
    to folders, then its subfolders), following no directory links. `os.scandir` gives each entry's
    type from the listing itself, so a regular file costs no stat call here (1.28 million of them
    would cost seconds). A folder that cannot be listed goes to `unreadable`, so its files are
    reported, not lost. A gs:// or s3:// folder comes from its store's one listing. `as_text` gives
    a file as the text the listing already made, a local path or `scheme://bucket/key` (no Path or
    RemotePath object: see `scan_tree`)."""
    if isinstance(folder, RemotePath):
        # A listing holds objects only, never links or folders: only a hidden name rules one out here.
        # Read from the text: pathlib's relative_to and a lookup for each of a million objects cost minutes.
        start = len(str(folder)) + 1
        for text in folder.walk_file_texts():
            reason = "hidden file" if hidden or any(map(_is_hidden, text[start:].split("/"))) else None
            yield (text if as_text else as_path(text)), reason
        return
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as error:
        unreadable.append(SkippedFile(Path(error.filename or folder), f"{UNREADABLE_FOLDER} ({error.strerror or error})"))
        return
    child = _child_maker(folder)
    subfolders, folder_links = [], []
    item = (lambda entry: entry.path) if as_text else (lambda entry: child(entry.name))
    for entry in entries:
        if _entry_is_dir(entry):
            (folder_links if entry.is_symlink() else subfolders).append(entry)
        else:
            yield item(entry), _entry_reason(entry, hidden or _is_hidden(entry.name))
    for entry in folder_links:
        yield item(entry), _entry_reason(entry, hidden or _is_hidden(entry.name))
    for entry in subfolders:
        yield from _walk_files(child(entry.name), unreadable, hidden or _is_hidden(entry.name), as_text)


def _child_maker(folder: Path):
    """`folder / name` for names from a listing of `folder`. pathlib's own child constructor (what
    `Path.iterdir` uses) skips parsing the name again: 0.4 instead of 2.6 us a file, seconds over
    ImageNet's 1.28 million; where a Python lacks it, the public way."""
    make = getattr(folder, "_make_child_relpath", None)
    return make if callable(make) else folder.joinpath


def _entry_is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows a link, as os.walk does when it sorts entries into folders and files
    except OSError:
        return False


def _entry_reason(entry: os.DirEntry, hidden: bool) -> str | None:
    """`_unusable_reason` from a directory entry: no system call for a regular file."""
    if hidden:
        return "hidden file"
    if entry.is_symlink() and not os.path.exists(entry.path):
        return "dangling link"
    if _entry_is_dir(entry):
        return "link to a directory"
    try:
        regular = entry.is_file()
    except OSError:
        regular = False
    return None if regular else "not a regular file"


def _is_split_layout(root: Path, subdirs: list[Path]) -> bool:
    return bool(subdirs) and all(d.name in SPLIT_NAMES for d in subdirs)


def scan_tree(root: Path | str, labels: tuple[str, ...] | None = None,
              on_file: Callable[[str, str, int, str], None] | None = None) -> FolderTree:
    """Scans an image tree (a local folder, gs:// or s3://). `labels` (from a labels file) fixes the
    label order; else sorted folder names.

    With `on_file(path, split, label, label_text)` every usable file goes to it as it is listed, as
    text (a local path, or `scheme://bucket/key`), instead of into the tree, whose `files` is then
    empty: a listing of millions of files (`convert`, a files source) need not hold a Path and an
    ImageFile for each, about 370 bytes a file beside what the caller keeps. A file in a store is
    stat'ed from the listing with `location.listed_info(text)`.

    On a network file system (`storage/mounts.py`) the scan runs on a watched thread: a listing that
    lists nothing more for the storage timeout is a StorageError naming the folder, not a hang."""
    root = as_path(root)
    listed = Ticks()  # files walked so far: how far the scan has come
    return NetworkGuard.of(root, flag="")(lambda: _scan_tree(root, labels, on_file, listed), f"listing {str(root)!r}",
                                          listed, unit="files")


def _scan_tree(root: Path | RemotePath, labels: tuple[str, ...] | None,
               on_file: Callable[[str, str, int, str], None] | None, listed: Ticks) -> FolderTree:
    if not root.exists():
        raise UsageError(f"dataset path {str(root)!r} does not exist")
    if not root.is_dir():
        raise UsageError(f"dataset path {str(root)!r} is not a directory; expected a {{label}}/* or {{split}}/{{label}}/* tree")
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise UsageError(f"dataset path {str(root)!r} cannot be listed ({exc.strerror or exc})") from None
    subdirs = [e for e in entries if e.is_dir() and not e.is_symlink() and not _is_hidden(e.name)]
    skipped: list[SkippedFile] = []
    has_splits = _is_split_layout(root, subdirs)
    class_dirs: list[tuple[str, Path]] = []  # (split, class folder)
    if has_splits:
        for split_dir in subdirs:
            try:
                split_entries = sorted(split_dir.iterdir())
            except OSError as exc:
                skipped.append(SkippedFile(split_dir, f"{UNREADABLE_FOLDER} ({exc.strerror or exc})"))
                continue
            for entry in split_entries:
                if entry.is_dir() and not entry.is_symlink() and not _is_hidden(entry.name):
                    class_dirs.append((split_dir.name, entry))
                elif _is_dataset_index(entry):
                    skipped.append(SkippedFile(entry, DATASET_INDEX))
                else:
                    skipped.extend(_unplaceable(entry, "not inside a class folder", skipped))
    else:
        class_dirs = [(DEFAULT_SPLIT, d) for d in subdirs]
    for entry in entries:
        if _is_dataset_index(entry):
            skipped.append(SkippedFile(entry, DATASET_INDEX))
        elif entry not in subdirs:
            skipped.extend(_unplaceable(entry, "not inside a class folder", skipped))

    folder_labels = _labels_with_files(class_dirs, labels, skipped)
    if labels is None:
        labels = tuple(folder_labels)
    else:
        missing = [name for name in folder_labels if name not in labels]
        if missing:
            raise UsageError(
                f"--labels: class folder {missing[0]!r} is not in the labels file "
                f"({len(missing)} folder(s) missing); every folder needs a label in [0, {len(labels)})"
            )
    index = {name: i for i, name in enumerate(labels)}
    class_dirs = [(split, d) for split, d in class_dirs if d.name in index]

    files: list[ImageFile] = []
    for split, class_dir in class_dirs:
        label_text = class_dir.name  # one string a class, not one a file
        label = index[label_text]
        for path, reason in _walk_files(class_dir, skipped, as_text=on_file is not None):
            listed.count += 1
            if reason:
                skipped.append(SkippedFile(as_path(path), reason))
            elif on_file is not None:
                on_file(path, split, label, label_text)
            else:
                files.append(ImageFile(path, split, label, label_text))
    if not class_dirs:
        raise DataError(f"dataset path {str(root)!r} has no class folders; expected a {{label}}/* or {{split}}/{{label}}/* tree")
    return FolderTree(root, tuple(labels), tuple(files), tuple(skipped), has_splits)


def _labels_with_files(class_dirs: list[tuple[str, Path]], labels: tuple[str, ...] | None,
                       skipped: list[SkippedFile]) -> list[str]:
    """The class folders' names, sorted, without those that hold no file in any split: each of those
    is warned about and skipped, unless the labels file names it (then it stays a label with 0
    examples, warned about too). Names that differ only by case are warned about: two labels here,
    one folder on a case-insensitive file system, and likely one class."""
    by_name: dict[str, list[Path]] = {}
    for _, folder in class_dirs:
        by_name.setdefault(folder.name, []).append(folder)
    kept = []
    for name, folders in sorted(by_name.items()):
        if any(map(_holds_a_file, folders)):
            kept.append(name)
        elif labels is not None and name in labels:
            log.warning("class folder %r holds no files: kept as label %d, with 0 examples, because --labels names it",
                        name, labels.index(name))
        else:
            log.warning("class folder %s holds no files: skipped, not a label", folders[0])
            skipped.extend(SkippedFile(folder, EMPTY_CLASS_FOLDER) for folder in folders)
    by_case: dict[str, list[str]] = {}
    for name in kept:
        by_case.setdefault(name.casefold(), []).append(name)
    for names in by_case.values():
        if len(names) > 1:
            log.warning("class folders %s differ only by case: they are %d labels; merge them if they are one class",
                        " and ".join(repr(n) for n in names), len(names))
    return kept


def _holds_a_file(folder: Path) -> bool:
    """Whether any file that is not hidden lies below `folder`: listed only until the first one (one
    directory read for a class folder of images). A folder that cannot be listed counts as holding
    files: the scan then reports it as unreadable."""
    if isinstance(folder, RemotePath):
        start = len(str(folder)) + 1
        return any(not any(map(_is_hidden, text[start:].split("/"))) for text in folder.walk_file_texts())
    try:
        with os.scandir(folder) as listing:
            subfolders = []
            for entry in listing:
                if _is_hidden(entry.name):
                    continue
                if not _entry_is_dir(entry) or entry.is_symlink():
                    return True
                subfolders.append(entry.path)
    except OSError:
        return True
    return any(_holds_a_file(Path(sub)) for sub in subfolders)


def _unplaceable(entry: Path, reason: str, unreadable: list[SkippedFile]) -> list[SkippedFile]:
    if entry.is_dir() and not entry.is_symlink():
        # files of a hidden folder (.git, .Trash) are "hidden file", the rest keep the given reason
        return [SkippedFile(p, why or reason) for p, why in _walk_files(entry, unreadable, _is_hidden(entry.name))]
    return [SkippedFile(entry, _unusable_reason(entry, entry.parent) or reason)]


def _unusable_reason(path: Path, class_dir: Path) -> str | None:
    """Reasons knowable from the directory entry alone; content checks come later."""
    rel_parts = path.relative_to(class_dir).parts
    if any(_is_hidden(part) for part in rel_parts):
        return "hidden file"
    if path.is_symlink() and not path.exists():
        return "dangling link"
    if path.is_dir():
        return "link to a directory"
    if not path.is_file():
        return "not a regular file"
    return None
