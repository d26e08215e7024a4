"""Image folders to sharded TFRecords plus `manifest.json`: `convert_tree(options) -> ConvertReport`.

The plan (which file goes to which shard, in which order) is a pure function of the tree and the
options (`sharding.py`), so a run killed at any moment and started again ends with the same bytes:
a shard appears under its final name only when complete, each completed shard leaves a small state
file recording the plan it was written for, a re-run keeps shards whose state and sha256 still
match and rewrites the rest, and the manifest is written last.

Workers own pieces of the output, as tensorflow/models' build_image_data.py threads own shards:
each worker is handed a shard (or, when there are fewer shards than workers need to stay busy, a
contiguous segment of one) as a list of paths, and reads, checks, repairs, encodes and writes it
itself without TensorFlow, hashing the bytes as it writes them, its reads kept ahead of its checks
where they wait (a network file system: `read_ahead.py`). No image bytes travel between
processes; the parent only plans, joins the segments of a split shard, and writes the manifest.
A tree in a bucket is the exception: the parent fetches the bytes a few chunks ahead and writes the
shards, so that workers need no store client (`_write_fetched`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import multiprocessing
import os
import shlex
import shutil
import stat as statmod
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from stallscope.config import require_choice, require_positive, to_dict, usable_cores
from stallscope.data import images
from stallscope.data.folders import DATASET_INDEX, FolderTree, read_labels_file, scan_tree
from stallscope.errors import DataError, UsageError
from stallscope.lifetime import die_with_parent
from stallscope.records import sharding
from stallscope.records.completeness import RUN_NAME, STATE_DIR, read_run
from stallscope.records.lock import LOCK_NAME, ExclusiveLock
from stallscope.records.manifest import (
    LABELS_NAME, MANIFEST_NAME, Manifest, ShardInfo, SplitInfo, load_manifest, save_manifest, write_json_atomic,
)
from stallscope.records.read_ahead import FileReader, ReadStats, process_reader, read_file
from stallscope.records.same_conversion import refuse_other_conversion, refuse_other_unfinished
from stallscope.records.schema import SCHEMAS, get_schema
from stallscope.records.writer import (
    OutputFull, RecordFile, ShardWriter, encode_example_bytes, encode_example_parts, file_sha256, frame_record,
    is_convert_temporary, is_temporary,
)
from stallscope.records.worker_lifetime import stopped_by_parent
from stallscope.storage.location import RemotePath, StorageError, as_path, listed_info, read_many
from stallscope.storage.mounts import NetworkGuard, Ticks

log = logging.getLogger(__name__)

DEFAULT_SIZE_PER_RECORD = 52_428_800  # seed-000's default: 50 MiB
TASKS_PER_WORKER = 4  # shards are cut into segments until every worker has about this many tasks
MIN_SEGMENT_IMAGES = 32  # but never into segments smaller than this
PROGRESS_IMAGES = 16  # an in-process conversion reports progress this often
# A tree in a bucket: the parent fetches each chunk's bytes (CHUNK_IMAGES requests in flight), this many
# chunks ahead of the workers, so that the workers need no store client; the parent writes the shards.
CHUNK_IMAGES = 16
REMOTE_CHUNKS_AHEAD = 4
LINK_OUT_OF_TREE = "a link out of the tree"  # not read: its target's bytes are no part of the data set (--follow-links)
VANISHED = "vanished during conversion"
UNREADABLE = "unreadable"

Progress = Callable[[int, int], None]  # (images done so far, images in total)


def default_workers() -> int:
    return usable_cores() + 1


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """Everything that decides a conversion's output. Shard by `size_per_record` bytes (seed-000, the
    default, 50 MiB) or by `shards` per split (seed-003); `split_shards` sets one split's count."""

    dataset_path: Path
    output_path: Path
    labels_file: Path | None = None
    size_per_record: int | None = None
    shards: int | None = None
    split_shards: tuple[tuple[str, int], ...] = ()
    workers: int | None = None  # None: default_workers()
    schema: str = "standard"
    max_side: int | None = None
    jpeg_quality: int | str = images.KEEP_QUALITY
    max_pixels: int = images.DEFAULT_MAX_PIXELS
    check: str = "stream"
    seed: int = 0
    read_ahead: int | None = None  # files each worker reads ahead; None: where reads wait (read_ahead.py)
    replace: bool = False  # replace a finished conversion of another source or plan in output_path
    follow_links: bool = False  # read files whose links lead out of dataset_path (default: skipped, not read)
    staging_dir: Path | None = None  # where an output in a bucket is staged; None: remote_output's default

    def __post_init__(self) -> None:
        for name in ("dataset_path", "output_path", "labels_file", "staging_dir"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (Path, RemotePath)):
                object.__setattr__(self, name, as_path(value) if name in ("dataset_path", "output_path") else Path(value))
        require_choice("schema", self.schema, SCHEMAS)
        require_positive("size_per_record", self.size_per_record, allow_none=True)
        require_positive("shards", self.shards, allow_none=True)
        require_positive("workers", self.workers, allow_none=True)
        if self.read_ahead is not None and (isinstance(self.read_ahead, bool) or not isinstance(self.read_ahead, int)
                                            or self.read_ahead < 0):
            raise UsageError(f"--read-ahead: expected 'auto' or a whole number >= 0, got {self.read_ahead!r}")
        if self.size_per_record is not None and self.shards is not None:
            raise UsageError(
                f"--size_per_record ({self.size_per_record}) and --shards ({self.shards}) both given; expected one of them"
            )
        object.__setattr__(self, "split_shards", tuple((str(s), n) for s, n in self.split_shards))
        for split, count in self.split_shards:
            require_positive(f"--{split}-shards", count)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise UsageError(f"seed: expected an integer, got {self.seed!r}")
        if self.staging_dir is not None and not isinstance(self.output_path, RemotePath):
            raise UsageError(f"--staging-dir: applies to an --output_path in a bucket (gs://, s3://); got --output_path "
                             f"{str(self.output_path)!r}, written in place")
        self.image_options  # validates max_side, jpeg_quality, max_pixels, check

    @property
    def image_options(self) -> images.ImageOptions:
        return images.ImageOptions(max_side=self.max_side, jpeg_quality=self.jpeg_quality, max_pixels=self.max_pixels,
                                   check=self.check)

    @property
    def resolved_workers(self) -> int:
        """The worker processes: by default one more than the cores, so that a core whose worker waits
        for the disk still has one to decode (measured on cold files: +8% on 2 cores, no change warm)."""
        return self.workers or default_workers()


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One file the scan placed in a class folder, with the identity a resumed run compares. Its path
    is the root's joined with `name` (`source_path`): a Path object for each of a million files would
    hold three times what the rest of the candidate does."""

    name: bytes  # path relative to the dataset root, as the file system spells it
    split: str
    label: int
    label_text: str
    size: int
    mtime_ns: int


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedShard:
    split: str
    filename: str
    items: tuple[Candidate, ...]
    fingerprint: str  # sha256 of everything that decides this shard's bytes


@dataclasses.dataclass(frozen=True)
class ConvertReport:
    output_path: Path
    manifest: Manifest
    examples: int
    shards: int
    bytes_written: int  # total bytes of all shards
    input_bytes: int  # bytes of the files this run read (not those of shards kept from an earlier run)
    skipped_by_reason: dict[str, int]
    repaired: int
    repairs_by_kind: dict[str, int]
    reused_shards: int
    elapsed_s: float  # the whole run: planning, conversion and, into a bucket, the upload
    reads: ReadStats | None = None  # the workers' reads of a local (or mounted) tree
    kept_examples: int = 0  # images in the shards kept from an earlier run, not converted by this one

    @property
    def converted_examples(self) -> int:
        """The images this run converted: a resumed run's rate is of these, over its whole time."""
        return self.examples - self.kept_examples

    @property
    def images_per_second(self) -> float:
        return self.converted_examples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def megabytes_per_second(self) -> float:
        return self.input_bytes / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0


def display_name(name: bytes) -> str:
    """A JSON-safe rendering of a file name; bytes that are not UTF-8 show as \\xNN."""
    return name.decode("utf-8", "backslashreplace")


def _file_entry(name: bytes, **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": display_name(name)}
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        entry["path_hex"] = name.hex()  # the exact bytes, for names that are not UTF-8
    entry.update(fields)
    return entry


# --- planning ---------------------------------------------------------------------------------


class _Candidates:
    """`scan_tree`'s `on_file`: each file stat'ed (the size and mtime a resumed run compares) as it is
    listed and kept as a Candidate, its name relative to the root cut from the path's text rather
    than computed with Path.relative_to (several microseconds a file). A tree in a bucket is stat'ed
    from its store's listing. A file that cannot be stat'ed goes to `skipped` with its reason."""

    def __init__(self, root: Path | RemotePath, follow_links: bool = False) -> None:
        self.root = root
        self.follow_links = follow_links
        self._real_root = os.fsencode(os.path.realpath(root)) if not isinstance(root, RemotePath) else b""
        self.skipped: list[dict[str, Any]] = []
        self.found: list[Candidate] = []
        self._remote = isinstance(root, RemotePath)
        self._prefix = os.fsencode(os.path.join(root, "")) if not self._remote else b""
        self._root_text = str(root)
        self._linked_sources: tuple[bytes, ...] | None = None  # read at the first link met: the listing's
        # work, which a network file system's watch bounds (not a read of the root before it)

    def _inside(self, real: bytes) -> bool:
        if self._linked_sources is None:
            self._linked_sources = _prepared_link_sources(Path(self.root))
        return any(real == folder or real.startswith(os.path.join(folder, b""))
                   for folder in (self._real_root, *self._linked_sources))

    def __call__(self, path: str, split: str, label: int, label_text: str) -> None:
        if self._remote:  # `scheme://bucket/key` below the root: its name is the text after the root's
            name = os.fsencode(path[len(self._root_text) + 1:])
            info = listed_info(path)
            if info is None:  # gone from the listing since the walk (a write or delete in this process)
                self.skipped.append(_file_entry(name, reason=UNREADABLE, detail=FileNotFoundError.__name__))
                return
            self.found.append(Candidate(name, split, label, label_text, info.size, info.mtime_ns))
            return
        where = os.fsencode(path)  # a root of "." lists its files without the "./":
        name = where[len(self._prefix):] if where.startswith(self._prefix) else os.fsencode(os.path.relpath(path, self.root))
        try:
            stat = os.lstat(where)  # one call for a plain file; a link's target is stat'ed once it is known to stay in
            if statmod.S_ISLNK(stat.st_mode):
                if not self.follow_links and not self._inside(os.path.realpath(where)):
                    self.skipped.append(_file_entry(name, reason=LINK_OUT_OF_TREE))
                    return
                stat = os.stat(where)
        except OSError as exc:
            self.skipped.append(_file_entry(name, reason=UNREADABLE, detail=exc.__class__.__name__))
            return
        self.found.append(Candidate(name, split, label, label_text, stat.st_size, stat.st_mtime_ns))


def _prepared_link_sources(root: Path) -> tuple[bytes, ...]:
    """The source folders `stallscope prepare` linked its files to where it could not hard-link them (its
    prepare.json, at the root or in a split's folder, says `mode: link`): their links are the data set's
    own, followed like files in the tree."""
    from stallscope.data.imagenet import REPORT_NAME

    found = []
    for report in (root / REPORT_NAME, *root.glob(f"*/{REPORT_NAME}")):
        try:
            record = json.loads(report.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (isinstance(record, dict) and record.get("format") == "stallscope-prepare" and record.get("mode") == "link"
                and record.get("symlinked") and isinstance(record.get("source"), str) and os.path.isdir(record["source"])):
            found.append(os.fsencode(os.path.realpath(record["source"])))
    return tuple(found)


def source_path(root: Path | RemotePath, name: bytes) -> str:
    """Where a candidate's file is, as a worker opens it: the dataset root joined with its name."""
    if isinstance(root, RemotePath):
        return str(root / os.fsdecode(name))
    return os.fsdecode(os.path.join(os.fsencode(root), name))


def _shard_counts(options: ConvertOptions, splits: Iterable[str]) -> dict[str, int | None]:
    per_split = dict(options.split_shards)
    unknown = sorted(set(per_split) - set(splits))
    if unknown:
        raise UsageError(
            f"--{unknown[0]}-shards: the tree has no split {unknown[0]!r}; it has {', '.join(splits) or 'none'}"
        )
    return {split: per_split.get(split, options.shards) for split in splits}


def plan_shards(options: ConvertOptions, candidates: list[Candidate], labels: tuple[str, ...]) -> list[PlannedShard]:
    """Seeded shuffle per split, then cut by count or by size. Pure given the candidates."""
    splits = list(dict.fromkeys(c.split for c in candidates))
    counts = _shard_counts(options, splits)
    target = options.size_per_record or DEFAULT_SIZE_PER_RECORD
    plan = []
    for split in splits:
        items = sharding.shuffled([c for c in candidates if c.split == split], options.seed, split)
        for item in items:
            if not 0 <= item.label < len(labels):  # seed-002's trap: one_hot would give all zeros
                raise DataError(f"{display_name(item.name)}: label {item.label} outside [0, {len(labels)})")
        count = counts[split]
        if count is not None and count > len(items):
            raise UsageError(f"--shards {count}: split {split!r} has only {len(items)} image(s); expected at most {len(items)} shards")
        ranges = sharding.ranges_by_count(len(items), count) if count else sharding.ranges_by_size([c.size for c in items], target)
        for index, span in enumerate(ranges):
            filename = sharding.shard_filename(split, index, len(ranges))
            shard_items = tuple(items[i] for i in span)
            plan.append(PlannedShard(split, filename, shard_items, _fingerprint(options, filename, shard_items)))
    return plan


def _fingerprint(options: ConvertOptions, filename: str, items: tuple[Candidate, ...]) -> str:
    data = {
        "filename": filename, "schema": options.schema, "max_side": options.max_side,
        "jpeg_quality": options.jpeg_quality, "max_pixels": options.max_pixels, "check": options.check,
        "items": [[c.name.hex(), c.label, c.label_text, c.size, c.mtime_ns] for c in items],
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# --- worker side (no TensorFlow) ----------------------------------------------------------------

# (path, or the bytes read or why not; name, label, label_text): what a worker is sent per image.
# A local tree's items carry paths (workers read them); a tree in a bucket's, the bytes the parent fetched.
WorkItem = tuple[str | bytes | OSError, bytes, int, bytes]


def prepare_record(schema, image_options: images.ImageOptions, item: WorkItem, encode=encode_example_bytes) -> tuple:
    """Reads, checks, repairs and encodes one image: ("ok", payload, actions) or ("skip", reason, detail).
    With `encode=encode_example_parts` the payload is its parts, for `RecordFile.write_parts`."""
    path, name, label, label_text = item
    data = read_file(path) if isinstance(path, str) else path
    if isinstance(data, FileNotFoundError):
        return ("skip", VANISHED, "")
    if isinstance(data, OSError):
        return ("skip", UNREADABLE, f"{data.__class__.__name__}: {data.strerror or data}")
    try:
        image = images.prepare_image(data, image_options)
    except images.UnusableImage as exc:
        return ("skip", exc.reason, exc.detail)
    payload = encode(
        schema, image=image.data, label=label, filename=name, label_text=label_text,
        height=image.height, width=image.width,
    )
    return ("ok", payload, image.actions)


def process_chunk(schema_name: str, image_options: images.ImageOptions, items: list[WorkItem]) -> list[tuple]:
    """Reads, checks, repairs and encodes a few images: ("ok", frame, actions) or ("skip", reason, detail).
    An item of a tree in a bucket comes with its bytes already read (or the error reading them)."""
    schema = get_schema(schema_name)
    out = []
    for item in items:
        result = prepare_record(schema, image_options, item)
        out.append(("ok", frame_record(result[1]), result[2]) if result[0] == "ok" else result)
    return out


@dataclasses.dataclass(frozen=True)
class SegmentTask:
    """One worker's piece of the output: a shard, or segment `part` of `parts` of one, as paths only."""

    schema: str
    image_options: images.ImageOptions
    out: str
    state_dir: str
    shard: str  # the shard's file name
    fingerprint: str
    part: int
    parts: int
    items: tuple[WorkItem, ...]
    read_ahead: int | None = None  # ConvertOptions.read_ahead
    output_fs: str | None = None  # the network file system `out` is on, if any: its waits are bounded


def part_path(out: Path, shard: str, part: int) -> Path:
    """Where a worker writes segment `part` of a shard; hidden and temporary until joined."""
    return out / f".{shard}.part-{part:05d}.tmp-{os.getpid()}"


def _commit_shard(writer: ShardWriter, state_dir: Path, shard: str, state: dict[str, Any]) -> dict[str, Any]:
    """fsync, record the resume state, then rename: a shard is visible only with its state beside it."""

    def save_state(info: ShardInfo) -> None:
        state["shard"] = dataclasses.asdict(info)
        write_json_atomic(state_dir / f"{shard}.json", state)

    writer.commit(before_rename=save_state)
    return state


def write_segment(task: SegmentTask, progress: Callable[[int], None] | None = None,
                  reader: FileReader | None = None) -> dict[str, Any]:
    """Converts a task's images and writes them: a whole shard is committed here, under its final name
    with its state; a segment is left as a part file for `join_parts`. `progress(n)` (in-process runs
    only) hears of every PROGRESS_IMAGES images and of the last one before the shard is committed.
    The files are read by `reader` (default: this process's), ahead of the checks where reads wait.
    On a network file system, the writing is given up once no image has been written for the storage
    timeout (`storage/mounts.NetworkGuard`)."""
    reader = reader or process_reader(task.read_ahead)  # taken here: the guard's thread is new for each task
    written = Ticks()
    return NetworkGuard(task.output_fs)(lambda: _write_segment(task, progress, reader, written),
                                       f"writing {str(Path(task.out) / task.shard)!r}", written)


def _write_segment(task: SegmentTask, progress: Callable[[int], None] | None, reader: FileReader,
                   written: Ticks) -> dict[str, Any]:
    schema = get_schema(task.schema)
    out = Path(task.out)
    writer = ShardWriter(out / task.shard) if task.parts == 1 else RecordFile(part_path(out, task.shard, task.part), hashed=False)
    skipped: list[dict[str, Any]] = []
    repaired: list[dict[str, Any]] = []
    reported = 0
    try:
        for index, item in enumerate(reader.contents(task.items), 1):
            if written.given_up:  # the guard has reported this shard: its temporary goes, nothing more is written
                raise StorageError(f"writing {str(writer.file)!r} was given up")
            result = prepare_record(schema, task.image_options, item, encode_example_parts)
            if result[0] == "ok":
                writer.write_parts(result[1])
                if result[2]:
                    repaired.append(_file_entry(item[1], actions=list(result[2]), shard=task.shard))
            else:
                entry = _file_entry(item[1], reason=result[1])
                if result[2]:
                    entry["detail"] = result[2]
                skipped.append(entry)
            written.count = index
            if progress is not None and (index % PROGRESS_IMAGES == 0 or index == len(task.items)):
                progress(index - reported)
                reported = index
        if task.parts > 1:
            writer.close()
            return {"shard": task.shard, "images": len(task.items) - reported, "part": task.part, "file": str(writer.file),
                    "records": writer.records, "skipped": skipped, "repaired": repaired, "reads": reader.task_stats()}
        state = {"fingerprint": task.fingerprint, "skipped": skipped, "repaired": repaired}
        _commit_shard(writer, Path(task.state_dir), task.shard, state)
    except BaseException:
        writer.abort()
        raise
    log.info("wrote %s: %d records, %d bytes", task.shard, writer.records, writer.bytes)
    return {"shard": task.shard, "images": len(task.items) - reported, "state": state, "reads": reader.task_stats()}


def join_parts(out: str, state_dir: str, shard: str, fingerprint: str, parts: list[dict[str, Any]],
               output_fs: str | None = None) -> dict[str, Any]:
    """Concatenates a shard's segments in order into the shard, hashing them on the way, and commits it
    (bounded on a network file system, as `write_segment`)."""
    joined = Ticks()
    return NetworkGuard(output_fs)(lambda: _join_parts(out, state_dir, shard, fingerprint, parts, joined),
                                  f"writing {str(Path(out) / shard)!r}", joined, unit="segments")


def _join_parts(out: str, state_dir: str, shard: str, fingerprint: str, parts: list[dict[str, Any]],
                joined: Ticks) -> dict[str, Any]:
    state = {"fingerprint": fingerprint, "skipped": [e for p in parts for e in p["skipped"]],
             "repaired": [e for p in parts for e in p["repaired"]]}
    with ShardWriter(Path(out) / shard) as writer:
        for part in parts:
            writer.append_file(part["file"], part["records"])
            joined.count += 1
        _commit_shard(writer, Path(state_dir), shard, state)
    for part in parts:
        Path(part["file"]).unlink(missing_ok=True)
    log.info("wrote %s: %d records, %d bytes (%d segments)", shard, writer.records, writer.bytes, len(parts))
    return {"shard": shard, "images": 0, "state": state}


def segments_per_shard(shards: list[PlannedShard], workers: int, tasks_per_worker: int = TASKS_PER_WORKER) -> list[int]:
    """How many segments each shard is cut into: one while there are enough shards to keep `workers`
    busy to the end (each worker then writes and hashes whole shards), else enough to give each worker
    about `tasks_per_worker` tasks, never below MIN_SEGMENT_IMAGES images each. The bytes do not depend on it.
    Output on a network file system asks for one task a worker: a segment is joined by reading it back
    across the network and writing it again, which costs more there than an uneven tail."""
    wanted = workers * tasks_per_worker
    if workers <= 1 or len(shards) >= wanted:
        return [1] * len(shards)
    per_shard = -(-wanted // max(1, len(shards)))
    return [max(1, min(per_shard, len(s.items) // MIN_SEGMENT_IMAGES)) for s in shards]


def _segment_tasks(options: ConvertOptions, shards: list[PlannedShard], state_dir: Path, workers: int,
                   output_fs: str | None = None) -> Iterator[SegmentTask]:
    """The tasks in plan order, built lazily: a task holds its images' paths, never their bytes."""
    root = as_path(options.dataset_path)
    cuts = segments_per_shard(shards, workers, 1 if output_fs else TASKS_PER_WORKER)
    for shard, parts in zip(shards, cuts):
        for part, span in enumerate(sharding.ranges_by_count(len(shard.items), parts)):
            work = tuple((source_path(root, c.name), c.name, c.label, os.fsencode(c.label_text))
                         for c in shard.items[span.start:span.stop])
            yield SegmentTask(options.schema, options.image_options, str(options.output_path), str(state_dir),
                              shard.filename, shard.fingerprint, part, parts, work, options.read_ahead, output_fs)


def _start_method() -> str:
    """fork when it is safe (Linux, no TensorFlow threads in this process): fast, and scripts need no
    `if __name__ == "__main__"` guard. spawn otherwise: forking a process that runs TF's thread pools
    can deadlock the child."""
    return "fork" if sys.platform.startswith("linux") and "tensorflow" not in sys.modules else "spawn"


@contextlib.contextmanager
def _worker_pool(workers: int) -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    """`workers` processes, forked where it is safe, each with a one-thread BLAS pool, each ending with
    this process however it ends (`stallscope.lifetime`). An error lets the running tasks finish (their
    shards are kept for a rerun); Ctrl-C or SIGTERM (KeyboardInterrupt) stops the workers at once, by
    PID, and the caller removes what they left unfinished."""
    context = multiprocessing.get_context(_start_method())
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                                  initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException as exc:
        if not isinstance(exc, Exception):
            _stop_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


WORKER_STOP_S = 10.0  # a SIGKILLed worker is gone in milliseconds; this only bounds the wait


def _stop_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.kill()
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.join(WORKER_STOP_S)


def _start_worker(parent_pid: int) -> None:
    die_with_parent(parent_pid)
    stopped_by_parent()
    _one_blas_thread()


def _one_blas_thread() -> None:
    """A worker's BLAS pool is one thread. numpy comes into every worker with simplejpeg, and OpenBLAS
    starts a thread per core that busy-waits a while for work that never comes (no BLAS call is made
    here): user+sys 1.44-1.49 -> 1.30-1.33 s converting 1,500 images on 3 workers (`/usr/bin/time`).
    Where the parent had numpy already, the forked worker's pool is cut to one thread instead."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def _run_segments(tasks: Iterator[SegmentTask], workers: int, on_result: Callable[[dict[str, Any]], None]) -> None:
    """Runs the tasks, and the join of each split shard once its segments are written, on `workers`
    processes with a bounded number in flight; `on_result` sees each finished piece (a committed
    shard's result has its "state"). With one worker, everything runs in this process."""
    if workers <= 1:
        reader = None  # one for the run: what it learns of the storage holds for the tasks that follow
        for task in tasks:
            reader = reader or FileReader(task.read_ahead)
            on_result(write_segment(task, progress=lambda n, shard=task.shard: on_result({"shard": shard, "images": n}),
                                    reader=reader))
        return
    split: dict[str, tuple[SegmentTask, dict[int, dict[str, Any]]]] = {}  # shard -> (a task of it, its parts so far)
    with _worker_pool(workers) as pool:  # stops queued tasks on an error, the workers on Ctrl-C
        running: set[concurrent.futures.Future] = set()
        remaining = iter(tasks)
        while True:
            while len(running) < workers * 2 and (task := next(remaining, None)) is not None:
                if task.parts > 1:
                    split.setdefault(task.shard, (task, {}))
                running.add(pool.submit(write_segment, task))
            if not running:
                break
            done, running = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                result = future.result()
                on_result(result)
                if "part" not in result:
                    continue
                task, got = split[result["shard"]]
                got[result["part"]] = result
                if len(got) == task.parts:
                    del split[task.shard]
                    ordered = [got[i] for i in range(task.parts)]
                    running.add(pool.submit(join_parts, task.out, task.state_dir, task.shard, task.fingerprint, ordered,
                                            task.output_fs))


def _fetch_chunk(task: tuple) -> tuple:
    """The task with each path replaced by the object's bytes (or the OSError that stopped the read)."""
    schema_name, image_options, work = task
    paths = [as_path(item[0]) for item in work]
    try:
        contents: list = read_many(paths, len(paths))
    except StorageError:  # one object failed: read them one by one, so only that one is skipped
        contents = []
        for path in paths:
            try:
                contents.append(path.read_bytes())
            except FileNotFoundError as exc:
                contents.append(exc)  # vanished since the listing
            except (StorageError, OSError) as exc:
                contents.append(OSError(str(exc)))
    return schema_name, image_options, [(data, *item[1:]) for data, item in zip(contents, work)]


def _fetched_ahead(tasks: Iterator[tuple]) -> Iterator[tuple]:
    """The tasks of a tree in a bucket, their bytes fetched REMOTE_CHUNKS_AHEAD chunks ahead, in order."""
    with concurrent.futures.ThreadPoolExecutor(REMOTE_CHUNKS_AHEAD) as pool:
        window: collections.deque = collections.deque()
        for task in tasks:
            window.append(pool.submit(_fetch_chunk, task))
            if len(window) > REMOTE_CHUNKS_AHEAD:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()



def _ordered_map(fn, tasks: Iterator[tuple], workers: int) -> Iterator[list[tuple]]:
    """Results of `fn(*task)` in task order, with a bounded number of tasks in flight."""
    if workers <= 1:
        for task in tasks:
            yield fn(*task)
        return
    with _worker_pool(workers) as pool:
        window: collections.deque = collections.deque()
        for task in tasks:
            window.append(pool.submit(fn, *task))
            if len(window) >= workers * 4:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def _write_fetched(options: ConvertOptions, shards: list[PlannedShard], state_dir: Path,
                   on_result: Callable[[dict[str, Any]], None]) -> None:
    """A tree in a bucket: the parent fetches each chunk's bytes ahead, workers check and encode them,
    and the parent writes the shards in plan order (the workers need no store client)."""
    out = Path(options.output_path)
    root = as_path(options.dataset_path)

    def tasks() -> Iterator[tuple]:
        for shard in shards:
            for span in sharding.chunk_ranges(range(len(shard.items)), CHUNK_IMAGES):
                work = [(source_path(root, c.name), c.name, c.label, os.fsencode(c.label_text))
                        for c in shard.items[span.start:span.stop]]
                yield (options.schema, options.image_options, work)

    chunk_results = _ordered_map(process_chunk, _fetched_ahead(tasks()), options.resolved_workers)
    try:
        for shard in shards:
            skipped, repaired = [], []
            with ShardWriter(out / shard.filename) as writer:
                for span in sharding.chunk_ranges(range(len(shard.items)), CHUNK_IMAGES):
                    for item, result in zip(shard.items[span.start:span.stop], next(chunk_results)):
                        if result[0] == "ok":
                            writer.write_framed(result[1])
                            if result[2]:
                                repaired.append(_file_entry(item.name, actions=list(result[2]), shard=shard.filename))
                        else:
                            entry = _file_entry(item.name, reason=result[1])
                            if result[2]:
                                entry["detail"] = result[2]
                            skipped.append(entry)
                    if span.stop < len(shard.items):  # the last chunk's images are counted with the committed shard
                        on_result({"shard": shard.filename, "images": len(span)})
                    last = len(span)
                state = {"fingerprint": shard.fingerprint, "skipped": skipped, "repaired": repaired}
                _commit_shard(writer, state_dir, shard.filename, state)
            log.info("wrote %s: %d records, %d bytes", shard.filename, writer.records, writer.bytes)
            on_result({"shard": shard.filename, "images": last, "state": state})
    except BaseException:  # now, not when the traceback goes: the workers are stopped (`_worker_pool`)
        chunk_results.close()
        raise
    next(chunk_results, None)  # past its last chunk: the pool ends in order

# --- output directory and resume ------------------------------------------------------------------


def _owned_shards(out: Path) -> set[str]:
    """Shard names this tool's own records say it wrote: the manifest of a finished run, the state of an
    unfinished one. A file merely named like a shard is not among them, and is never deleted."""
    owned = set(read_run(out).get("owned", []))
    state = out / STATE_DIR
    if state.is_dir():
        owned |= {e.name[: -len(".json")] for e in state.iterdir() if sharding.SHARD_NAME.match(e.name[: -len(".json")])}
    if (out / MANIFEST_NAME).is_file():
        try:
            owned |= {s.file for split in load_manifest(out).splits.values() for s in split.shards}
        except DataError:
            pass  # an unreadable manifest vouches for nothing
    return owned


def _is_ours(name: str, owned: set[str]) -> bool:
    return name in (MANIFEST_NAME, LABELS_NAME, STATE_DIR) or name in owned or is_convert_temporary(name)


def _clear_temporaries(out: Path, state: Path) -> None:
    """Under the lock: the unfinished files of a run that no longer writes (an earlier, killed one, or
    this one stopping), in the output folder and in its state folder."""
    for entry in out.iterdir():
        if is_convert_temporary(entry.name):
            log.info("removing %s, left unfinished", entry.name)
            entry.unlink(missing_ok=True)
    if state.is_dir():
        for entry in state.iterdir():
            if is_temporary(entry.name):
                entry.unlink(missing_ok=True)


def _check_output(options: ConvertOptions) -> None:
    """Refuses an output folder inside the input, a file, or one holding anything convert did not write."""
    out = options.output_path
    root = options.dataset_path.resolve()
    resolved = out.resolve()
    if resolved == root or root in resolved.parents:
        raise UsageError(f"--output_path: {str(out)!r} is inside --dataset_path {str(options.dataset_path)!r}; expected a directory outside it")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output_path: {str(out)!r} is a file; expected a directory")
    if not out.is_dir():
        return
    if (out / STATE_DIR).is_symlink():  # its state would be written wherever the link leads
        raise UsageError(f"--output_path: {str(out / STATE_DIR)!r} is a symlink; expected the conversion's state "
                         "folder, which convert makes itself (remove the link; what it points to is left alone)")
    owned = _owned_shards(out)
    foreign = sorted(e.name for e in out.iterdir() if not _is_ours(e.name, owned))
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise UsageError(
            f"--output_path: {str(out)!r} holds {foreign[0]!r}{more}, which `stallscope convert` did not write "
            f"(neither {MANIFEST_NAME} nor a conversion's state lists it); it is left alone; "
            "expected an empty or new directory"
        )
    if not options.replace:
        _refuse_another_conversion(options)


def _refuse_another_conversion(options: ConvertOptions) -> None:
    """A folder holding a conversion of another source or plan is refused, not silently replaced."""
    out = options.output_path
    where = repr(str(out)) if isinstance(out, Path) else str(out)
    if (out / MANIFEST_NAME).is_file():
        try:
            manifest = load_manifest(out)
        except DataError:
            return  # an unreadable manifest vouches for nothing, and describes nothing to keep
        refuse_other_conversion(where, manifest, str(options.dataset_path.resolve()), recorded_options(options))
    elif isinstance(out, Path):
        refuse_other_unfinished(where, read_run(out).get("command", ""), convert_command(options))


def _make_state_dir(out: Path) -> Path:
    state = out / STATE_DIR
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--output_path: cannot write {str(out)!r} ({exc.strerror or exc.__class__.__name__}); expected a writable directory"
        ) from None
    return state


def convert_command(options: ConvertOptions) -> str:
    """The command line that runs this conversion again (and so finishes an interrupted one)."""
    parts = ["stallscope", "convert", str(options.dataset_path.resolve()), "--output_path", str(options.output_path.resolve())]
    if options.labels_file is not None:
        parts += ["--labels", str(options.labels_file.resolve())]
    if options.shards is not None:
        parts += ["--shards", str(options.shards)]
    if options.size_per_record is not None:
        parts += ["--size_per_record", str(options.size_per_record)]
    for split, count in options.split_shards:
        parts += [f"--{split}-shards", str(count)]
    if options.follow_links:
        parts.append("--follow-links")
    defaults = {"schema": "standard", "max_side": None, "jpeg_quality": images.KEEP_QUALITY,
                "max_pixels": images.DEFAULT_MAX_PIXELS, "check": "stream", "seed": 0}
    for name, default in defaults.items():
        value = getattr(options, name)
        if value != default:
            parts += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join(parts)


def _reset_output(options: ConvertOptions, state: Path, plan: list[PlannedShard]) -> None:
    """Under the lock: removes unfinished temporaries first (on a full disk they hold the space the rest
    needs), records what this tool owns before the manifest that listed it goes, then removes only
    owned shards the new plan has no place for."""
    out = options.output_path
    _clear_temporaries(out, state)
    owned = _owned_shards(out)
    command = convert_command(options)
    write_json_atomic(state / RUN_NAME, {"command": command, "owned": sorted(owned)})
    (out / MANIFEST_NAME).unlink(missing_ok=True)  # the directory is being rewritten: no stale manifest
    planned = {s.filename for s in plan}
    for entry in out.iterdir():
        if entry.name in owned and entry.name not in planned:
            log.info("removing %s left by an earlier run", entry.name)
            entry.unlink(missing_ok=True)
    for entry in state.iterdir():
        if entry.name.endswith(".tfrecord.json") and entry.name[: -len(".json")] not in planned:
            entry.unlink(missing_ok=True)
    still = sorted(name for name in owned if (out / name).exists())
    write_json_atomic(state / RUN_NAME, {"command": command, "owned": still})


def _state_path(state_dir: Path, shard: PlannedShard) -> Path:
    return state_dir / f"{shard.filename}.json"


def _reusable(out: Path, state_dir: Path, shard: PlannedShard, hashed: Ticks | None = None) -> dict[str, Any] | None:
    """The saved state of a shard completed by an earlier run of the same plan, if its bytes still match."""
    path = out / shard.filename
    try:
        state = json.loads(_state_path(state_dir, shard).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    info = state.get("shard", {})
    if state.get("fingerprint") != shard.fingerprint or not path.is_file() or path.stat().st_size != info.get("bytes"):
        return None
    if file_sha256(path, hashed) != info.get("sha256"):
        return None
    return state


# --- the conversion -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConversionPlan:
    """What a conversion will write, decided before any output is touched (shared with `beam_convert`)."""

    tree: FolderTree
    candidates: list[Candidate]
    skipped: list[dict[str, Any]]  # files the scan or the stat refused, with their reasons
    shards: list[PlannedShard]


def plan_conversion(options: ConvertOptions) -> ConversionPlan:
    """The listing, the seeded shuffle and the shard assignment: pure given the tree and the options."""
    labels = read_labels_file(options.labels_file) if options.labels_file else None
    found = _Candidates(as_path(options.dataset_path), options.follow_links)
    try:
        tree = scan_tree(options.dataset_path, labels, on_file=found)
    except StorageError as exc:
        raise StorageError(f"--dataset_path: {exc}") from None
    for label in tree.labels:
        try:
            label.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(f"class folder {label.encode('utf-8', 'surrogateescape')!r}: name is not UTF-8; rename it") from None
    root = tree.root
    skipped: list[dict[str, Any]] = [
        _file_entry(os.fsencode(s.path.relative_to(root)), reason=s.reason) for s in tree.skipped
    ]
    skipped.extend(found.skipped)  # files listed but not stat'ed
    candidates = found.found
    if not candidates:
        raise DataError(f"dataset path {str(root)!r}: no files in its class folders ({len(skipped)} other file(s) skipped)")
    return ConversionPlan(tree, candidates, skipped, plan_shards(options, candidates, tree.labels))


@contextlib.contextmanager
def claimed_output(options: ConvertOptions, plan: list[PlannedShard], guard: NetworkGuard = NetworkGuard()) -> Iterator[Path]:
    """Checks the output folder, locks it and clears what an earlier run left that `plan` has no use
    for; yields the state folder. The lock is held for the block. Each step is bounded by `guard`."""
    out = options.output_path

    def claim() -> tuple[Path, ExclusiveLock]:
        _check_output(options)
        state_dir = _make_state_dir(out)
        lock = ExclusiveLock(state_dir / LOCK_NAME, what=f"another `stallscope convert` into {str(out)!r}").acquire()
        try:
            _check_output(options)  # again: the run that held the lock may have changed the folder
            _reset_output(options, state_dir, plan)
            lock.name_holder()  # where a full disk refused it until a dead run's files went
        except BaseException:
            lock.release()
            raise
        return state_dir, lock

    state_dir, lock = guard(claim, f"preparing {str(out)!r}")
    try:
        yield state_dir
    except BaseException:  # an error, Ctrl-C, SIGTERM: the workers are stopped; what they left unfinished goes
        guard.cleanup(lambda: _clear_temporaries(out, state_dir), f"removing unfinished files in {str(out)!r}")
        raise
    finally:
        guard.cleanup(lock.release, f"unlocking {str(out)!r}")
        # A finished run removed the state folder under the lock, but where the lock file was still open
        # a network file system keeps it (NFS renames it to .nfsXXXX, FUSE to .fuse_hiddenXXXX) until
        # closed: the emptied folder goes now. A run that did not finish leaves its state, and rmdir fails.
        guard.cleanup(lambda: _remove_if_empty(state_dir), f"removing {str(state_dir)!r}")


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()


def convert_tree(options: ConvertOptions, progress: Progress | None = None) -> ConvertReport:
    """Converts `options.dataset_path` into shards and a manifest in `options.output_path` (either may be
    gs:// or s3://; an output in a bucket is staged locally, then published: `remote_output.py`)."""
    started = time.perf_counter()
    if isinstance(options.output_path, RemotePath):
        from stallscope.records.remote_output import convert_to_store

        if not options.replace:
            try:
                _refuse_another_conversion(options)  # the bucket's own manifest, before any work
            except StorageError as exc:
                raise StorageError(f"--output_path: {exc}") from None

        report = convert_to_store(options, progress, convert_local=convert_tree, command=convert_command(options))
        return dataclasses.replace(report, elapsed_s=time.perf_counter() - started)  # the upload counted

    plan = plan_conversion(options)
    guard = NetworkGuard.of(options.output_path)
    try:
        with claimed_output(options, plan.shards, guard) as state_dir:
            return _convert_planned(options, plan.tree, plan.shards, plan.candidates, plan.skipped, state_dir,
                                    progress, started, guard)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OutputFull(options.output_path, exc) from None
        raise


def _reused_states(out: Path, state_dir: Path, plan: list[PlannedShard], hashed: Ticks) -> dict[str, dict[str, Any]]:
    """The saved states of the shards an earlier run of the same plan completed and left intact."""
    results = {}
    for shard in plan:
        state = _reusable(out, state_dir, shard, hashed)
        if state is not None:
            results[shard.filename] = state
    return results


def _convert_planned(options, tree, plan, candidates, skipped, state_dir, progress, started,
                     guard: NetworkGuard = NetworkGuard()) -> ConvertReport:
    root = tree.root
    out = options.output_path
    total_images = len(candidates)

    hashed = Ticks()
    results: dict[str, dict[str, Any]] = guard(lambda: _reused_states(out, state_dir, plan, hashed),
                                               f"checking the shards an earlier run left in {str(out)!r}", hashed,
                                               unit="MB read")
    done = sum(len(s.items) for s in plan if s.filename in results)
    kept = set(results)
    if progress:
        progress(done, total_images)
    pending = [s for s in plan if s.filename not in results]

    reads = ReadStats()

    def on_result(result: dict[str, Any]) -> None:
        nonlocal done
        if "state" in result:
            results[result["shard"]] = result["state"]
        if "reads" in result:
            reads.add(result["reads"])
        done += result["images"]
        if progress and result["images"]:
            progress(done, total_images)

    if isinstance(tree.root, RemotePath):
        fetched = Ticks()

        def on_fetched(result: dict[str, Any]) -> None:
            if fetched.given_up:  # reported already: the thread left behind writes nothing more
                raise StorageError(f"writing into {str(out)!r} was given up")
            fetched.count += result["images"]
            on_result(result)

        guard(lambda: _write_fetched(options, pending, state_dir, on_fetched), f"writing into {str(out)!r}", fetched)
    else:
        workers = options.resolved_workers
        _run_segments(_segment_tasks(options, pending, state_dir, workers, guard.fstype), workers, on_result)

    manifest = _build_manifest(options, tree, plan, results, skipped)
    guard(lambda: save_manifest(out, manifest), f"writing {str(out / MANIFEST_NAME)!r}")
    guard.cleanup(lambda: shutil.rmtree(state_dir, ignore_errors=True), f"removing {str(state_dir)!r}")
    elapsed = time.perf_counter() - started
    report = _report(options, manifest, plan, kept, elapsed, reads if reads.timed_reads or reads.depth else None)
    if report.examples == 0:
        raise DataError(
            f"dataset path {str(root)!r}: no usable images; all {len(candidates)} file(s) in class folders were skipped "
            f"(reasons in {out / MANIFEST_NAME})"
        )
    return report


def _build_manifest(options, tree, plan, results, skipped) -> Manifest:
    splits: dict[str, SplitInfo] = {}
    repaired: list[dict[str, Any]] = []
    skipped = list(skipped)
    for split in dict.fromkeys(s.split for s in plan):
        infos = tuple(ShardInfo(**results[s.filename]["shard"]) for s in plan if s.split == split)
        splits[split] = SplitInfo(examples=sum(i.records for i in infos), shards=infos)
    for shard in plan:
        skipped.extend(results[shard.filename]["skipped"])
        repaired.extend(results[shard.filename]["repaired"])
    return Manifest(
        schema=options.schema,
        labels=tree.labels,
        splits=splits,
        options=recorded_options(options),
        skipped=tuple(sorted(skipped, key=lambda e: e["path"])),
        repaired=tuple(sorted(repaired, key=lambda e: e["path"])),
        source=str(tree.root.resolve()),
    )


def recorded_options(options: ConvertOptions) -> dict[str, Any]:
    """The options as the manifest records them: the shard size resolved, the workers counted."""
    recorded = to_dict(options)
    del recorded["replace"], recorded["staging_dir"]  # how and where this run works, not what it wrote
    recorded["size_per_record"] = None if options.shards else (options.size_per_record or DEFAULT_SIZE_PER_RECORD)
    recorded["workers"] = options.resolved_workers
    return recorded


def _report(options, manifest: Manifest, plan: list[PlannedShard], kept: Collection[str], elapsed: float,
            reads: ReadStats | None = None) -> ConvertReport:
    """The figures of this run: `kept` names the shards an earlier run finished, which it did not convert."""
    shards = [s for split in manifest.splits.values() for s in split.shards]
    by_reason = collections.Counter(e["reason"] for e in manifest.skipped)
    by_kind = collections.Counter(_repair_kind(a) for e in manifest.repaired for a in e["actions"])
    return ConvertReport(
        output_path=options.output_path,
        manifest=manifest,
        examples=sum(s.examples for s in manifest.splits.values()),
        shards=len(shards),
        bytes_written=sum(s.bytes for s in shards),
        input_bytes=sum(c.size for shard in plan if shard.filename not in kept for c in shard.items),
        skipped_by_reason=dict(by_reason.most_common()),
        repaired=len(manifest.repaired),
        repairs_by_kind=dict(by_kind.most_common()),
        reused_shards=len(kept),
        elapsed_s=elapsed,
        reads=reads,
        kept_examples=sum(s.records for s in shards if s.file in kept),
    )


def _repair_kind(action: str) -> str:
    """`downscaled 800x600 to 400x300` -> `downscaled`; groups actions for the summary."""
    for prefix in ("re-encoded", "downscaled", "applied EXIF orientation", "kept the first"):
        if action.startswith(prefix):
            return action.split(" as ")[0] if prefix == "re-encoded" else prefix
    return action


def format_summary(report: ConvertReport) -> list[str]:
    """The one-screen summary the CLI and the demo print."""
    mb = report.bytes_written / 1e6
    kept = (f" ({report.kept_examples} kept from an earlier run; {report.examples} in all)"
            if report.kept_examples else "")
    lines = [
        f"converted {report.converted_examples} images{kept} into {report.shards} shards ({mb:.1f} MB) in "
        f"{report.output_path}",
        f"  {report.elapsed_s:.1f} s, {report.images_per_second:.0f} images/s, {report.megabytes_per_second:.1f} MB/s read",
    ]
    for split, info in report.manifest.splits.items():
        lines.append(f"  {split}: {info.examples} examples in {len(info.shards)} shard(s)")
    by_reason = {reason: n for reason, n in report.skipped_by_reason.items() if reason != DATASET_INDEX}
    skipped = sum(by_reason.values())
    if skipped:
        detail = ", ".join(f"{n} {reason}" for reason, n in by_reason.items())
        lines.append(f"  skipped {skipped} file(s): {detail}")
    else:
        lines.append("  skipped 0 files")
    indexes = [e["path"] for e in report.manifest.skipped if e["reason"] == DATASET_INDEX]
    if indexes:
        lines.append(f"  not converted: {', '.join(indexes)} ({DATASET_INDEX}, listed in {MANIFEST_NAME})")
    if report.repaired:
        detail = ", ".join(f"{n} {kind}" for kind, n in report.repairs_by_kind.items())
        lines.append(f"  repaired {report.repaired} image(s): {detail}")
    if report.reused_shards:
        lines.append(f"  kept {report.reused_shards} complete shard(s) from an interrupted run")
    reads = report.reads
    if reads is not None and reads.depth:
        timed = f"{reads.mean_read_s * 1e3:.1f} ms a file read in turn, so " if reads.timed_reads else ""
        lines.append(f"  reads: {timed}each worker read up to {reads.depth} files ahead of its checks; "
                     f"they waited {reads.waited_s:.1f} s for reads in all")
    lines.append(f"  manifest: {report.output_path / MANIFEST_NAME}  labels: {report.output_path / LABELS_NAME}")
    return lines
