"""Unpacking the ILSVRC2012 training images into one folder per synset, from the archive as it comes.

`ILSVRC2012_img_train.tar` (138 GB) holds 1,000 archives, one per class, `n01440764.tar` ...,
each holding that synset's JPEGs (`n01440764_10026.JPEG` ...): 1,281,167 images. Here both levels are
read in order from the one file: the class archives are never unpacked to disk first (the usual shell
recipe writes every byte twice), memory does not grow with the images, and a file already in place
from an earlier run is passed over by a seek, not read (a compressed archive is read as a stream).
A folder of the class archives (the outer one unpacked by hand) is read the same way.

The class archive's name is the label, as tensorflow-datasets and tensorflow/models label ImageNet
train. Every regular file of a class archive is placed under `output/{synset}/`, also one whose bytes
are not a JPEG (ILSVRC2012 train has a PNG and CMYK JPEGs named `.JPEG`): `stallscope convert`
repairs or reports those, and the report names them. Files are written as `imagenet.py` writes the
validation images: under a temporary name, renamed into place with their time, kept on a second run.
A damaged class archive keeps what came before the damage and the run goes on with the next; a
damaged outer archive ends the run there. `prepare.json` records every file not placed, every
damaged archive, and whether the tree is complete.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from stallscope.data import archives
from stallscope.data.imagenet import REPORT_NAME, PerClassCounts, Unplaced
from stallscope.data.images import sniff_format
from stallscope.errors import DataError, UsageError
from stallscope.jsonfile import write_json_atomic

log = logging.getLogger(__name__)

TRAIN_IMAGES = 1_281_167  # ILSVRC2012 train, as tensorflow-datasets counts it
TRAIN_CLASSES = 1_000
CLASS_ARCHIVE_SUFFIX = ".tar"
_HEAD = 32  # bytes enough for `sniff_format`


@dataclasses.dataclass(frozen=True)
class ImagenetTrainReport(PerClassCounts):
    output: Path
    source: Path
    source_kind: str  # "tar" or "folder" (of class archives)
    per_class: dict[str, int]  # images in each synset folder of the output, after the run
    placed: int  # files this run wrote
    in_place: int  # files an earlier run had already placed
    unplaced: tuple[Unplaced, ...]  # files (and members that are not class archives) left out, and why
    not_jpeg: tuple[Unplaced, ...]  # placed, but their bytes are not a JPEG: convert repairs or reports them
    damaged: tuple[Unplaced, ...]  # class archives that broke off; what came before the damage is placed
    archive_error: str | None  # the outer archive broke off here; what came before it is in place
    seconds: float

    @property
    def complete(self) -> bool:
        """Every class archive of the source was read to its end (says nothing of files left out)."""
        return self.archive_error is None and not self.damaged

    @property
    def is_whole_ilsvrc2012_train(self) -> bool:
        return self.complete and self.images == TRAIN_IMAGES and self.classes == TRAIN_CLASSES

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "stallscope-prepare",
            "kind": "imagenet-train",
            "source": str(self.source),
            "source_kind": self.source_kind,
            "complete": self.complete,
            "archive_error": self.archive_error,
            "classes": self.classes,
            "images": self.images,
            "whole_ilsvrc2012_train": self.is_whole_ilsvrc2012_train,
            "min_per_class": self.min_per_class,
            "max_per_class": self.max_per_class,
            "placed_this_run": self.placed,
            "already_in_place": self.in_place,
            "unplaced": [dataclasses.asdict(u) for u in self.unplaced],
            "not_jpeg": [dataclasses.asdict(u) for u in self.not_jpeg],
            "damaged_class_archives": [dataclasses.asdict(u) for u in self.damaged],
            "per_class": dict(sorted(self.per_class.items())),
        }


@dataclasses.dataclass
class _Tally:
    synsets: set[str] = dataclasses.field(default_factory=set)  # of the class archives met
    placed: int = 0
    in_place: int = 0
    unplaced: list[Unplaced] = dataclasses.field(default_factory=list)
    not_jpeg: list[Unplaced] = dataclasses.field(default_factory=list)
    damaged: list[Unplaced] = dataclasses.field(default_factory=list)
    archive_error: str | None = None


def synset_of_archive(name: str) -> str | None:
    """`n01440764` for a class archive `n01440764.tar` (in any folder), None for anything else."""
    base = PurePosixPath(name).name
    if not base.endswith(CLASS_ARCHIVE_SUFFIX):
        return None
    synset = base[: -len(CLASS_ARCHIVE_SUFFIX)]
    if not synset or synset.startswith(".") or "\\" in synset:
        return None
    return synset


class _ClassArchive:
    """Places the files of one class archive under `output/{synset}/`."""

    def __init__(self, where: str, synset: str, output: Path, tally: _Tally) -> None:
        self.where, self.synset, self.folder, self.tally = where, synset, output / synset, tally
        tally.synsets.add(synset)
        self.current: tuple[str, bool] | None = None  # the member being read, and whether it was in place
        self.last: str | None = None  # the last member dealt with
        self.buffer = bytearray(archives.CHUNK)
        self.folder_made = False

    def place_all(self, raw: IO[bytes], seekable: bool) -> None:
        """Raises `archives.DAMAGE` where the archive breaks off; what came before is placed."""
        problems: list[Exception] = []
        archive, _ = archives.open_archive(raw, problems, seekable=seekable)
        seen: set[str] = set()
        for member in archives.members(archive):
            self.last = member.name
            if member.isdir():
                continue
            name = PurePosixPath(member.name).name
            where = f"{self.where}:{member.name}"
            if not member.isfile():
                self.tally.unplaced.append(Unplaced(where, "not a regular file in the archive"))
            elif name.startswith("."):
                self.tally.unplaced.append(Unplaced(where, "a hidden name; images are named like n01440764_10026.JPEG"))
            elif name in seen:
                self.tally.unplaced.append(Unplaced(where, f"a second copy of {name}; the first one was placed"))
            else:
                seen.add(name)
                self._place(archive, member, name, where)
        if problems:
            raise tarfile.ReadError(f"{problems[0]}: the archive ends early or a header is damaged")

    def _place(self, archive: tarfile.TarFile, member: tarfile.TarInfo, name: str, where: str) -> None:
        target = self.folder / name
        in_place = archives.same_file_data(target, member.size, member.mtime)
        self.current = (where, in_place)
        with archive.extractfile(member) as data:
            head = data.read(_HEAD)
            if not in_place:
                if not self.folder_made:
                    with archives.writing(self.folder):
                        self.folder.mkdir(parents=True, exist_ok=True)
                    self.folder_made = True
                archives.place_member(data, head, member.mtime, target, self.buffer)
        self.current = None
        if in_place:
            self.tally.in_place += 1
        else:
            self.tally.placed += 1
        found = sniff_format(head)
        if found != "JPEG":
            what = f"a {found}" if found else f"not an image format stallscope knows (starting {head[:4].hex() or 'with nothing'})"
            self.tally.not_jpeg.append(Unplaced(where, f"placed; its bytes are {what}: `stallscope convert` repairs or reports it"))

    def broke(self, exc: BaseException) -> Unplaced:
        """What to report when the archive broke off with `exc`; the half-written file is unplaced."""
        if self.current is not None:
            where, in_place = self.current
            if not in_place:
                self.tally.unplaced.append(Unplaced(where, f"unreadable: the archive breaks off here ({exc})"))
            at = f"in {PurePosixPath(where.split(':', 1)[1]).name}"
        else:
            at = f"after {self.last}" if self.last else "at its start"
        return Unplaced(self.where, f"damaged or cut short {at} ({exc}); what came before is placed")


def _place_from_tar(source: Path, output: Path, tally: _Tally, progress: archives.ProgressSink | None) -> None:
    try:
        raw = open(source, "rb")
    except OSError as exc:
        raise UsageError(f"SOURCE: cannot read {str(source)!r} ({exc.strerror or exc})") from None
    header_problems: list[Exception] = []
    last = None
    broken: tuple[_ClassArchive, BaseException] | None = None  # a class archive that broke off, not yet blamed
    with raw:
        try:
            outer, seekable = archives.open_archive(archives.PositionReader(raw, progress, source.stat().st_size), header_problems)
        except archives.DAMAGE as exc:
            raise DataError(f"{source}: {exc}; expected ILSVRC2012_img_train.tar or a folder of its class archives") from None
        try:
            for member in archives.members(outer):
                if broken is not None:  # the outer archive went on: the damage was the class archive's own
                    tally.damaged.append(broken[0].broke(broken[1]))
                    broken = None
                last = member.name
                if member.isdir():
                    continue
                synset = synset_of_archive(member.name)
                if synset is None or not member.isfile():
                    tally.unplaced.append(Unplaced(member.name, f"not a class archive (expected a regular file named like n01440764{CLASS_ARCHIVE_SUFFIX})"))
                    continue
                archive = _ClassArchive(member.name, synset, output, tally)
                try:
                    with outer.extractfile(member) as data:
                        archive.place_all(data, seekable)
                except archives.DAMAGE as exc:
                    broken = (archive, exc)
            if header_problems:
                raise tarfile.ReadError(f"{header_problems[0]}: the archive ends early or a header is damaged")
            if broken is not None:
                tally.damaged.append(broken[0].broke(broken[1]))
        except archives.DAMAGE as exc:
            where = f"after {last}" if last else "at its start"
            if broken is not None:  # the class archive broke off because the outer one did
                broken[0].broke(broken[1])
                where = f"in {broken[0].where}"
            tally.archive_error = f"{source}: the archive is damaged or cut short {where} ({exc})"


def _class_archives(source: Path, output: Path, tally: _Tally) -> Iterator[tuple[Path, str]]:
    """The class archives of a folder (the outer archive unpacked), sorted; anything else but the
    output is reported."""
    skip = output.resolve()
    entries = [(p, synset_of_archive(p.name) if p.is_file() else None)
               for p in sorted(source.iterdir()) if p.resolve() != skip]
    if not any(synset for _, synset in entries):
        folders = [p.name for p, _ in entries if p.is_dir() and not p.name.startswith(".")]
        hint = (f"; its {len(folders)} folder(s) look unpacked already: give it to train or convert as --dataset-path"
                if folders else "")
        raise DataError(f"SOURCE: {str(source)!r} holds no class archive (n01440764{CLASS_ARCHIVE_SUFFIX} ...){hint}")
    for path, synset in entries:
        if synset is not None:
            yield path, synset
        elif not path.name.startswith("."):
            tally.unplaced.append(Unplaced(path.name, f"not a class archive (expected a file named like n01440764{CLASS_ARCHIVE_SUFFIX})"))


def _place_from_folder(source: Path, output: Path, tally: _Tally, progress: archives.ProgressSink | None) -> None:
    archives_found = list(_class_archives(source, output, tally))
    total = sum(path.stat().st_size for path, _ in archives_found)
    for path, synset in archives_found:
        archive = _ClassArchive(path.name, synset, output, tally)
        try:
            with open(path, "rb") as raw:
                archive.place_all(archives.PositionReader(raw, progress, total), seekable=True)
        except archives.DAMAGE as exc:
            tally.damaged.append(archive.broke(exc))


def _tidy_output(output: Path, synsets: set[str]) -> dict[str, int]:
    """Removes temporaries of killed runs from the synset folders of the source's class archives;
    returns the files in each as the tree now stands. Other folders under the output are not ours to
    count or touch."""
    per_class: Counter[str] = Counter()
    for synset in sorted(synsets):
        try:
            entries = list(os.scandir(output / synset))
        except FileNotFoundError:  # an empty or unreadable class archive: nothing placed
            continue
        for entry in entries:
            if archives.is_tmp_name(entry.name):
                os.unlink(entry.path)
            elif not entry.name.startswith(".") and entry.is_file():
                per_class[synset] += 1
    return dict(per_class)


def prepare_imagenet_train(
    source: Path | str,
    output: Path | str,
    *,
    progress: archives.ProgressSink | None = None,
) -> ImagenetTrainReport:
    """Unpacks the class archives of `source` (the train tar, or a folder of its class archives) into
    `output/{synset}/`."""
    source, output = Path(source), Path(output)
    started = time.perf_counter()
    if not source.exists():
        raise UsageError(f"SOURCE: {str(source)!r} does not exist; expected ILSVRC2012_img_train.tar or a folder of its class archives")
    is_tar = source.is_file()
    if not is_tar and output.resolve() == source.resolve():
        raise UsageError(f"--output: {str(output)!r} is the SOURCE folder; choose another directory for the synset folders")
    guard = archives.network_guard(source, output)
    first_created = guard(lambda: archives.make_output(output), f"creating {str(output)!r}")

    tally = _Tally()

    def place() -> dict[str, int]:
        if is_tar:
            _place_from_tar(source, output, tally, progress)
        else:
            _place_from_folder(source, output, tally, progress)
        return _tidy_output(output, tally.synsets)

    def files_met() -> int:
        return tally.placed + tally.in_place + len(tally.unplaced) + len(tally.not_jpeg) + len(tally.damaged)

    try:
        per_class = guard(place, f"placing files into {str(output)!r}", files_met, unit="files")
        if not per_class:
            problem = tally.archive_error or (tally.damaged[0].reason if tally.damaged else None)
            example = f", e.g. {tally.unplaced[0].name}: {tally.unplaced[0].reason}" if tally.unplaced else ""
            raise DataError(
                f"SOURCE: {str(source)!r}: no training image could be placed"
                + (f" ({problem})" if problem else f"; {len(tally.unplaced)} entr(ies) could not be placed{example}")
            )
    except BaseException:
        guard.cleanup(lambda: archives.remove_empty_created(output, first_created), f"tidying {str(output)!r}")
        raise
    for item in (*tally.damaged, *tally.unplaced):
        log.info("not placed: %s: %s", item.name, item.reason)
    report = ImagenetTrainReport(
        output=output,
        source=source,
        source_kind="tar" if is_tar else "folder",
        per_class=per_class,
        placed=tally.placed,
        in_place=tally.in_place,
        unplaced=tuple(tally.unplaced),
        not_jpeg=tuple(tally.not_jpeg),
        damaged=tuple(tally.damaged),
        archive_error=tally.archive_error,
        seconds=time.perf_counter() - started,
    )
    guard(lambda: write_json_atomic(output / REPORT_NAME, report.to_json()), f"writing {str(output / REPORT_NAME)!r}")
    return report
