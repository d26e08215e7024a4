"""Sorting the ILSVRC2012 validation images into one folder per synset (seed-000's `images/` layout).

The 50,000 validation JPEGs come in one flat archive, named `ILSVRC2012_val_00000001.JPEG` ...;
their classes live elsewhere. By default the ground truth is the file tensorflow-datasets ships,
`datasets/imagenet2012/validation_labels.txt`: line i is the synset of file number i+1. A user may
give their own file in the same format.

The source is the original tar, read in order (no extraction first; a compressed one as a stream), or
a folder of the extracted files. Each image is written under a temporary name and renamed, so a killed
run leaves no half file, and a finished file is not written again (nor read: a seek passes over it):
running twice gives the same tree. An
ILSVRC file the output holds in a folder the ground truth contradicts (left by a run with another
labels file) is removed, so the tree is what a fresh run would make. Files that cannot be placed
are reported with their reason, and `prepare.json` records the outcome.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.metadata
import importlib.resources
import logging
import os
import re
import shutil
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from stallscope.config import require_choice
from stallscope.data import archives
from stallscope.data.folders import read_text_file
from stallscope.errors import DataError, UsageError
from stallscope.extras import install_line
from stallscope.jsonfile import write_json_atomic

log = logging.getLogger(__name__)
JPEG_MAGIC = b"\xff\xd8\xff"  # every JPEG starts with SOI and a marker

REPORT_NAME = "prepare.json"
FILE_PATTERN = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG")
PATTERN_TEXT = "ILSVRC2012_val_NNNNNNNN.JPEG"
GROUND_TRUTH_RESOURCE = "datasets/imagenet2012/validation_labels.txt"
SYNSETS_RESOURCE = "datasets/imagenet2012/labels.txt"
MODES = ("copy", "link")
_TMP_PREFIX = ".ILSVRC2012_val_"

ProgressSink = archives.ProgressSink


@dataclasses.dataclass(frozen=True)
class GroundTruth:
    """Synset of each validation image: `synsets[i]` belongs to ILSVRC2012_val_{i+1:08d}.JPEG."""

    synsets: tuple[str, ...]
    source: str  # where it came from, for reports

    def synset_of(self, number: int) -> str | None:
        return self.synsets[number - 1] if 1 <= number <= len(self.synsets) else None

    @property
    def classes(self) -> int:
        return len(set(self.synsets))


@dataclasses.dataclass(frozen=True)
class ImagenetValOptions:
    """labels_file: ground truth in validation_labels.txt's format; None uses the shipped one.
    mode: for a folder source, "copy" the files or "link" them (hard link, else symbolic link);
    a tar source is always extracted."""

    labels_file: Path | None = None
    mode: str = "copy"

    def __post_init__(self) -> None:
        require_choice("mode", self.mode, MODES)


@dataclasses.dataclass(frozen=True)
class Unplaced:
    """A file of the source that is not in the output tree, and why."""

    name: str
    reason: str


class PerClassCounts:
    """A prepared tree's numbers, from its `per_class` field: images in each synset folder."""

    per_class: dict[str, int]

    @property
    def images(self) -> int:
        return sum(self.per_class.values())

    @property
    def classes(self) -> int:
        return len(self.per_class)

    @property
    def min_per_class(self) -> int:
        return min(self.per_class.values(), default=0)

    @property
    def max_per_class(self) -> int:
        return max(self.per_class.values(), default=0)


@dataclasses.dataclass(frozen=True)
class ImagenetValReport(PerClassCounts):
    output: Path
    source: Path
    source_kind: str  # "tar" or "folder"
    mode: str  # "extract", "copy" or "link"
    ground_truth: str
    ground_truth_classes: int
    per_class: dict[str, int]  # images in each synset folder of the output, after the run
    placed: int  # files this run wrote
    in_place: int  # files an earlier run had already placed
    symlinked: int  # of `placed` in link mode: symbolic links where a hard link was impossible
    unplaced: tuple[Unplaced, ...]
    removed: tuple[Unplaced, ...]  # files of the output that contradicted the ground truth
    archive_error: str | None  # the tar broke off here; what came before it is in place
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "stallscope-prepare",
            "kind": "imagenet-val",
            "source": str(self.source),
            "source_kind": self.source_kind,
            "mode": self.mode,
            "ground_truth": self.ground_truth,
            "complete": self.archive_error is None,
            "archive_error": self.archive_error,
            "classes": self.classes,
            "images": self.images,
            "min_per_class": self.min_per_class,
            "max_per_class": self.max_per_class,
            "placed_this_run": self.placed,
            "already_in_place": self.in_place,
            "symlinked": self.symlinked,
            "unplaced": [dataclasses.asdict(u) for u in self.unplaced],
            "removed": [dataclasses.asdict(u) for u in self.removed],
            "per_class": dict(sorted(self.per_class.items())),
        }


def _tfds_resource(relative: str):
    try:
        return importlib.resources.files("tensorflow_datasets").joinpath(relative)
    except ModuleNotFoundError:
        raise UsageError(
            "--labels: no labels file given and tensorflow-datasets, which ships the ILSVRC2012 "
            f"ground truth, is not installed: {install_line('imagenet')}, or pass --labels FILE"
        ) from None


def _check_synset_name(name: str, where: str) -> None:
    """A synset becomes a folder name: refuse anything that is not a plain name."""
    if name in (".", "..") or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise UsageError(f"{where}: {name!r} cannot be a class folder name; expected a synset such as n01751748")


def parse_ground_truth(text: str, source: str) -> GroundTruth:
    """One synset per line, line i for image i+1; blank lines at the end are ignored, not in between."""
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise UsageError(f"--labels: {source} holds no labels; expected one synset per line, line i for ILSVRC2012_val_<i>.JPEG")
    synsets = []
    for number, line in enumerate(lines, start=1):
        name = line.strip()
        if not name:
            raise UsageError(f"--labels: {source} line {number} is blank; every line up to the last must name the synset of image {number}")
        _check_synset_name(name, f"--labels: {source} line {number}")
        synsets.append(name)
    return GroundTruth(tuple(synsets), source)


def load_ground_truth(labels_file: Path | None = None) -> GroundTruth:
    """The user's labels file, or the validation ground truth tensorflow-datasets ships."""
    if labels_file is not None:
        path = Path(labels_file)
        text = read_text_file(path, "--labels", "one synset per line")
        return parse_ground_truth(text, repr(str(path)))
    resource = _tfds_resource(GROUND_TRUTH_RESOURCE)
    try:
        text = resource.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"--labels: tensorflow-datasets has no {GROUND_TRUTH_RESOURCE}; pass --labels FILE"
        ) from None
    version = importlib.metadata.version("tensorflow-datasets")
    return parse_ground_truth(text, f"tensorflow-datasets {version} {GROUND_TRUTH_RESOURCE}")


def shipped_synsets() -> tuple[str, ...]:
    """The 1,000 ILSVRC2012 synsets in tensorflow-datasets' class order (`labels.txt`)."""
    text = _tfds_resource(SYNSETS_RESOURCE).read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def image_number(name: str) -> int | None:
    """The number in ILSVRC2012_val_00000001.JPEG (1), or None for any other name."""
    match = FILE_PATTERN.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclasses.dataclass
class _Tally:
    placed: int = 0
    in_place: int = 0
    symlinked: int = 0
    unplaced: list[Unplaced] = dataclasses.field(default_factory=list)
    targets: dict[str, Path] = dataclasses.field(default_factory=dict)  # file name -> where it went
    archive_error: str | None = None


def _target(name: str, truth: GroundTruth, output: Path, tally: _Tally, where: str) -> Path | None:
    """Where a source file belongs, or None (and the reason recorded) when it has no place."""
    number = image_number(name)
    if number is None:
        tally.unplaced.append(Unplaced(where, f"name does not match {PATTERN_TEXT}"))
        return None
    synset = truth.synset_of(number)
    if synset is None:
        tally.unplaced.append(Unplaced(where, f"image number {number} is beyond the ground truth ({len(truth.synsets)} images)"))
        return None
    if name in tally.targets:
        tally.unplaced.append(Unplaced(where, f"a second copy of {name}; the first one was placed"))
        return None
    target = output / synset / name
    tally.targets[name] = target
    return target


def _place_from_tar(source: Path, output: Path, truth: GroundTruth, tally: _Tally, progress: ProgressSink | None) -> None:
    damage = archives.DAMAGE
    try:
        raw = open(source, "rb")
    except OSError as exc:
        raise UsageError(f"SOURCE: cannot read {str(source)!r} ({exc.strerror or exc})") from None
    current = last = None  # the member being written; the last member dealt with
    header_problems: list[Exception] = []
    with raw:
        try:
            archive, _ = archives.open_archive(archives.PositionReader(raw, progress, source.stat().st_size), header_problems)
        except damage as exc:
            raise DataError(f"{source}: {exc}; expected ILSVRC2012_img_val.tar or a folder of its JPEGs") from None
        try:
            for member in archives.members(archive):
                last = member.name
                if member.isdir():
                    continue
                name = PurePosixPath(member.name).name
                if not member.isfile():
                    tally.unplaced.append(Unplaced(member.name, "not a regular file in the archive"))
                    continue
                target = _target(name, truth, output, tally, member.name)
                if target is None:
                    continue
                if archives.same_file_data(target, member.size, member.mtime):
                    tally.in_place += 1
                    continue
                current = member.name
                not_jpeg = _extract(archive, member, target)
                current = None
                if not_jpeg:
                    tally.targets.pop(name, None)
                    tally.unplaced.append(Unplaced(member.name, not_jpeg))
                    continue
                tally.placed += 1
            if header_problems:
                raise tarfile.ReadError(f"{header_problems[0]}: the archive ends early or a header is damaged")
        except damage as exc:
            if current is not None:
                tally.targets.pop(PurePosixPath(current).name, None)
                tally.unplaced.append(Unplaced(current, f"unreadable: the archive breaks off here ({exc})"))
                where = f"in {current}"
            else:
                where = f"after {last}" if last else "at its start"
            tally.archive_error = f"{source}: the archive is damaged or cut short {where} ({exc})"


def _not_jpeg(head: bytes, size: int) -> str | None:
    """The reason a file named like a validation image is not one, judged by its first bytes."""
    if head[:3] == JPEG_MAGIC:
        return None
    return f"not a JPEG ({size} bytes, starting {head[:4].hex() or 'with nothing'})"


def _extract(archive: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> str | None:
    """Streams one member into place (`archives.place_member`); returns why it was not placed when it
    is not a JPEG."""
    with archive.extractfile(member) as data:
        head = data.read(4)
        reason = _not_jpeg(head, member.size)
        if reason:
            return reason
        with archives.writing(target.parent):
            target.parent.mkdir(parents=True, exist_ok=True)
        archives.place_member(data, head, member.mtime, target)
    return None


def _source_files(source: Path, output: Path) -> Iterator[Path]:
    """Every non-directory entry under the source folder, sorted, never descending into the output."""
    skip = output.resolve()
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = sorted(d for d in dirnames if (Path(dirpath) / d).resolve() != skip)
        for name in sorted(filenames):
            yield Path(dirpath) / name


def _link_or_copy(path: Path, tmp: Path, mode: str) -> bool:
    """Puts the source at tmp; returns True when a symbolic link had to stand in for a hard link."""
    if mode == "copy":
        shutil.copy2(path, tmp)
        return False
    try:
        os.link(path, tmp)
        return False
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
    os.symlink(path.resolve(), tmp)
    return True


def _place_from_folder(source: Path, output: Path, truth: GroundTruth, mode: str, tally: _Tally, progress: ProgressSink | None) -> None:
    files = list(_source_files(source, output))
    for path in files:
        if progress:
            progress(1, len(files), "file")
        where = str(path.relative_to(source))
        target = _target(path.name, truth, output, tally, where)
        if target is None:
            continue
        try:
            stat = path.stat()
            if not path.is_file():
                raise IsADirectoryError(errno.EISDIR, "not a regular file")
            with open(path, "rb") as handle:  # readable (a link would not tell), and a JPEG?
                not_jpeg = _not_jpeg(handle.read(4), stat.st_size)
            if not_jpeg:
                tally.targets.pop(path.name, None)
                tally.unplaced.append(Unplaced(where, not_jpeg))
                continue
            if mode == "link" and target.exists() and os.path.samefile(path, target):
                tally.in_place += 1
                continue
            if mode == "copy" and not target.is_symlink() and archives.same_file_data(target, stat.st_size, stat.st_mtime):
                tally.in_place += 1
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = archives.tmp_path(target)
            try:
                tally.symlinked += _link_or_copy(path, tmp, mode)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            tally.placed += 1
        except OSError as exc:
            tally.targets.pop(path.name, None)
            tally.unplaced.append(Unplaced(where, f"unreadable: {exc.strerror or exc}"))


def _tidy_output(output: Path, truth: GroundTruth) -> tuple[dict[str, int], list[Unplaced]]:
    """Removes temporaries of killed runs and files that contradict the ground truth (left by a run
    with other labels); returns the images per synset folder as the tree now stands."""
    per_class: Counter[str] = Counter()
    removed: list[Unplaced] = []
    if not output.is_dir():
        return {}, removed
    for folder in sorted(p for p in output.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(_TMP_PREFIX) and archives.is_tmp_name(entry.name):  # only ours: ILSVRC names
                entry.unlink(missing_ok=True)
                continue
            number = image_number(entry.name)
            if number is None:
                continue
            synset = truth.synset_of(number)
            if synset == folder.name:
                per_class[folder.name] += 1
                continue
            # Left by a run with other ground truth: a fresh run would not have put it here.
            belongs = f"the ground truth puts it in {synset}" if synset else "its number is beyond the ground truth"
            entry.unlink()
            removed.append(Unplaced(str(entry.relative_to(output)), f"removed: {belongs}"))
        if not any(folder.iterdir()):
            folder.rmdir()
    return dict(per_class), removed


def prepare_imagenet_val(
    source: Path | str,
    output: Path | str,
    options: ImagenetValOptions = ImagenetValOptions(),
    *,
    progress: ProgressSink | None = None,
) -> ImagenetValReport:
    """Sorts the validation images of `source` (tar or folder) into `output/{synset}/`."""
    source, output = Path(source), Path(output)
    started = time.perf_counter()
    if not source.exists():
        raise UsageError(f"SOURCE: {str(source)!r} does not exist; expected ILSVRC2012_img_val.tar or a folder of its JPEGs")
    is_tar = source.is_file()
    if is_tar and options.mode == "link":
        raise UsageError(f"--link: {str(source)!r} is an archive; linking needs a folder of extracted JPEGs as SOURCE")
    if not is_tar and source.resolve().is_relative_to(output.resolve()):
        # The output's misplaced ILSVRC files are removed at the end: never the source's own.
        raise UsageError(f"--output: {str(output)!r} holds the SOURCE folder {str(source)!r}; choose a directory outside it")
    truth = load_ground_truth(options.labels_file)
    guard = archives.network_guard(source, output)
    first_created = guard(lambda: archives.make_output(output), f"creating {str(output)!r}")

    tally = _Tally()

    def place() -> tuple[dict[str, int], list[Unplaced]]:
        if is_tar:
            _place_from_tar(source, output, truth, tally, progress)
        else:
            _place_from_folder(source, output, truth, options.mode, tally, progress)
        return _tidy_output(output, truth)

    try:
        per_class, removed = guard(place, f"placing files into {str(output)!r}",
                                   lambda: tally.placed + tally.in_place + len(tally.unplaced), unit="files")
        if not per_class and tally.archive_error:
            raise DataError(f"{tally.archive_error}; nothing could be placed")
        if not per_class:
            example = f", e.g. {tally.unplaced[0].name}: {tally.unplaced[0].reason}" if tally.unplaced else ""
            raise DataError(
                f"SOURCE: {str(source)!r} holds no ILSVRC2012 validation image ({PATTERN_TEXT}, a JPEG) "
                f"to place; {len(tally.unplaced)} file(s) could not be placed{example}"
            )
    except BaseException:
        guard.cleanup(lambda: archives.remove_empty_created(output, first_created), f"tidying {str(output)!r}")
        raise
    for item in tally.unplaced:
        log.info("not placed: %s: %s", item.name, item.reason)
    report = ImagenetValReport(
        output=output,
        source=source,
        source_kind="tar" if is_tar else "folder",
        mode="extract" if is_tar else options.mode,
        ground_truth=truth.source,
        ground_truth_classes=truth.classes,
        per_class=per_class,
        placed=tally.placed,
        in_place=tally.in_place,
        symlinked=tally.symlinked,
        unplaced=tuple(tally.unplaced),
        removed=tuple(removed),
        archive_error=tally.archive_error,
        seconds=time.perf_counter() - started,
    )
    guard(lambda: write_json_atomic(output / REPORT_NAME, report.to_json()), f"writing {str(output / REPORT_NAME)!r}")
    return report
