"""`stallscope convert --runner beam`: the local convert's plan, shards and manifest, with the images
read, checked, repaired and written by Apache Beam workers (Dataflow, Flink, Spark, or this machine).

The launcher lists the tree and plans the shards exactly as the local convert does (`plan_conversion`:
the same seeded shuffle and cut), claims and locks the output folder by the same rules, and writes
each pending shard's item list into the state folder (the job graph carries only shard names, so a
million-image plan does not bloat it). One Beam element is one shard: a worker reads its item list,
checks and repairs every image (`images.prepare_image`), writes the records under a temporary name,
saves the shard's state (sha256, counts, skipped and repaired files) and only then renames the shard
into place. No image bytes cross a shuffle. When the pipeline is done the launcher builds the
manifest from the states and writes it last, so an interrupted run leaves an unfinished-looking
folder that `verify` and `train` refuse and that either runner finishes (the states are the same).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from stallscope.data import images
from stallscope.errors import DataError, UsageError
from stallscope.extras import install_line
from stallscope.records.completeness import RUN_NAME, STATE_DIR
from stallscope.records.convert import (
    ConvertOptions, ConvertReport, PlannedShard, Progress, _build_manifest, _fetch_chunk, _file_entry,
    _refuse_another_conversion, _report, _reusable, _state_path, claimed_output, convert_command, plan_conversion,
    prepare_record, source_path,
)
from stallscope.records.manifest import LABELS_NAME, MANIFEST_NAME, ShardInfo, save_manifest, write_json_atomic
from stallscope.records.read_ahead import FileReader, process_reader
from stallscope.records.schema import get_schema
from stallscope.records.writer import ShardWriter, frame_record
from stallscope.storage import location
from stallscope.storage.mounts import NetworkGuard, Ticks
from stallscope.storage.location import RemotePath, StorageError

log = logging.getLogger(__name__)

# What `DirectRunner` runs a batch job on, minus its first try: downloading the Prism runner's binary.
DEFAULT_RUNNER = "FnApiRunner"
PLAN_DIR = "beam-plan"  # in the state folder: one item list per pending shard
INSTALL_HINT = f"{install_line('beam')} (or apache-beam)"
# Runners whose workers run on other machines and so can never see a path of this one.
REMOTE_ONLY_RUNNERS = ("dataflowrunner", "dataflow")
# Images a worker fetches at once from a bucket (the local convert's chunk: its requests are in flight together).
FETCH_CHUNK = 32
# How often the launcher counts the shards the workers have finished, for the progress bar: in a local
# state folder, and in a bucket's (one listing request each time).
PROGRESS_POLL_S = 2.0
REMOTE_PROGRESS_POLL_S = 10.0


def is_remote(path: str) -> bool:
    """`gs://bucket/x`, `s3://...`: read and written through stallscope's own store clients (TF's gs://,
    obstore), the same as every other command, so a worker needs nothing but stallscope and the store's
    usual credentials."""
    return location.is_remote(path)


def require_beam():
    """apache_beam, imported without the warnings it logs about Google Cloud clients it does not need here."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        import apache_beam
    except ImportError:
        raise UsageError(f"--runner beam: Apache Beam is not installed; expected it installed: {INSTALL_HINT}") from None
    finally:
        logging.disable(previous)
    return apache_beam


# --- pipeline options -------------------------------------------------------------------------------


def read_options_file(path: Path | str) -> tuple[str, ...]:
    """Beam options as on a command line, any number per line; `#` starts a comment."""
    flag = f"--beam-options-file {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc.__class__.__name__
        raise UsageError(f"{flag}: expected a readable UTF-8 text file of Beam options, got {reason}") from None
    try:
        return tuple(shlex.split(text, comments=True))
    except ValueError as exc:
        raise UsageError(f"{flag}: expected Beam options as on a command line (--runner=DataflowRunner ...), got {exc}") from None


def _beam_parser(flag: str):
    """Beam's own parser for every option class it knows (and the installed runners add), refusing
    instead of exiting: Beam alone drops an unknown option with a warning, and a misspelt
    `--num_worker=100` would silently run on one worker."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    class RefusingParser(_BeamArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            if message.startswith("ambiguous option: "):
                return  # Beam's own rule: ignored
            raise UsageError(f"{flag}: expected Apache Beam pipeline options, got {message}")

    parser = RefusingParser(allow_abbrev=False, add_help=False)
    classes: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        classes.setdefault(str(cls), cls)
    for cls in classes.values():
        cls._add_argparse_args(parser)  # pylint: disable=protected-access
    return parser


def check_pipeline_args(args: Sequence[str], flag: str) -> None:
    beam = require_beam()
    _, unknown = _beam_parser(flag).parse_known_args(list(args))
    if unknown:
        raise UsageError(
            f"{flag}: expected an Apache Beam {beam.__version__} pipeline option (--runner=..., --num_workers=N, "
            f"--temp_location=...), got {unknown[0]!r}"
        )


def pipeline_args(cli_args: Sequence[str] = (), options_file: Path | str | None = None) -> tuple[str, ...]:
    """The options file's arguments, then the command line's (a later one wins), checked, with
    `--runner` defaulting to DEFAULT_RUNNER."""
    from_file = read_options_file(options_file) if options_file is not None else ()
    if from_file:
        check_pipeline_args(from_file, f"--beam-options-file {options_file}")
    check_pipeline_args(cli_args, "--beam-option")
    args = (*from_file, *cli_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args = (f"--runner={DEFAULT_RUNNER}", *args)
    return args


def _runner_name(args: Sequence[str]) -> str:
    """The runner `args` name, once Beam has shown it can create it (before any output is touched)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.runners.runner import create_runner

    name = str(PipelineOptions(list(args)).view_as(StandardOptions).runner or DEFAULT_RUNNER)
    try:
        create_runner(name)
    except (ValueError, ImportError) as exc:  # an unknown runner, or one whose extra is not installed
        raise UsageError(f"--beam-option: expected a runner Apache Beam can start, got {name!r} "
                         f"({str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__})") from None
    return name


def _check_reachable(options: ConvertOptions, runner: str) -> None:
    if runner.lower().rsplit(".", 1)[-1] not in REMOTE_ONLY_RUNNERS:
        return
    for flag, path in (("--dataset_path", options.dataset_path), ("--output_path", options.output_path)):
        if not is_remote(str(path)):
            raise UsageError(
                f"{flag}: {runner} workers run on other machines and cannot read {str(path)!r} on this one; "
                "expected a bucket path (gs://... or s3://...)"
            )


# --- worker side -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One Beam element: which shard to write, and where its item list is."""

    filename: str
    fingerprint: str
    output_dir: str
    state_dir: str
    schema: str
    image_options: images.ImageOptions
    read_ahead: int | None = None  # ConvertOptions.read_ahead, for a local or mounted tree

    @property
    def plan_file(self) -> str:
        return _join(self.state_dir, PLAN_DIR, f"{self.filename}.json")


def _join(base: str, *parts: str) -> str:
    if is_remote(base):
        return "/".join([base.rstrip("/"), *parts])
    return os.path.join(base, *parts)


def _read_bytes(path: str) -> bytes:
    if is_remote(path):
        return location.as_path(path).read_bytes()
    with open(path, "rb") as handle:
        return handle.read()


def judge_image(data: bytes | OSError, name: bytes, label: int, label_text: bytes, schema_name: str,
                image_options: images.ImageOptions) -> tuple:
    """One image's bytes (or the error that stopped their read), as the local convert's workers judge
    them: ("ok", frame, actions) or ("skip", reason, detail)."""
    result = prepare_record(get_schema(schema_name), image_options, (data, name, label, label_text))
    return ("ok", frame_record(result[1]), result[2]) if result[0] == "ok" else result


def _judged_items(items: list, remote_input: bool, schema_name: str, image_options: images.ImageOptions,
                  reader: FileReader) -> Iterator[tuple[bytes, tuple]]:
    """(name, judgement) for each item of a shard's plan; from a bucket, FETCH_CHUNK requests at once;
    from a local or mounted tree, by `reader`: ahead of the checks where reads wait (`read_ahead.py`)."""
    decoded = [(bytes.fromhex(p), bytes.fromhex(n), label, bytes.fromhex(t)) for p, n, label, t in items]
    if not remote_input:
        for data, name, label, text in reader.contents(decoded):
            yield name, judge_image(data, name, label, text, schema_name, image_options)
        return
    for start in range(0, len(decoded), FETCH_CHUNK):
        chunk = [(path.decode("utf-8", "surrogateescape"), name, label, text)
                 for path, name, label, text in decoded[start:start + FETCH_CHUNK]]
        _, _, fetched = _fetch_chunk((schema_name, image_options, chunk))
        for data, name, label, text in fetched:
            yield name, judge_image(data, name, label, text, schema_name, image_options)


class UploadingShardWriter:
    """`ShardWriter`'s contract (nothing visible until complete; the state saved before the shard
    appears) for a shard in a bucket: the records go to a local temporary file, hashed as they are
    written, then up under a temporary object name, and the rename makes the shard visible."""

    def __init__(self, target: RemotePath) -> None:
        self.target = target
        self._scratch = tempfile.TemporaryDirectory(prefix="stallscope-shard-")
        self._local = ShardWriter(Path(self._scratch.name) / target.name)
        self._uploaded: RemotePath | None = None
        self._info: ShardInfo | None = None

    @property
    def records(self) -> int:
        return self._local.records

    def write_framed(self, frame: bytes) -> None:
        self._local.write_framed(frame)

    def commit(self, before_rename: Callable[[ShardInfo], None] | None = None) -> ShardInfo:
        info = self._local.commit()
        store = location.backend(self.target)
        tmp = location.temporary_name(self.target)
        store.upload(self._local.path, tmp)
        self._uploaded = tmp
        if before_rename is not None:
            before_rename(info)
        store.rename(tmp, self.target)
        self._uploaded = None
        self._info = info
        self._scratch.cleanup()
        return info

    def abort(self) -> None:
        self._local.abort()
        if self._uploaded is not None:
            try:
                location.backend(self.target).delete(self._uploaded)
            except (StorageError, OSError):
                log.warning("could not remove %s; the next run removes it", self._uploaded)
        self._scratch.cleanup()

    def __enter__(self) -> "UploadingShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._info is None:
            self.abort()


def _write_json(path: str, data: Any) -> None:
    if is_remote(path):
        location.write_bytes(location.as_path(path), json.dumps(data, indent=2, ensure_ascii=True).encode() + b"\n")
    else:
        write_json_atomic(Path(path), data)


def _shard_writer(path: str):
    return UploadingShardWriter(location.as_path(path)) if is_remote(path) else ShardWriter(Path(path))


def convert_shard(task: ShardTask) -> str:
    """Writes one whole shard (the Beam worker's job): records under a temporary name, then the
    shard's state, then the rename. Returns the shard's file name. Into a network file system the
    worker has mounted (a cluster's shared NFS), the writing is given up, and the bundle failed for the
    runner to retry, once no image has been written for the storage timeout (`storage/mounts.NetworkGuard`)."""
    guard = NetworkGuard.of(task.output_dir)
    reader = process_reader(task.read_ahead)  # this thread's: the guard's thread is new for each shard
    written = Ticks()
    return guard(lambda: _convert_shard(task, written, reader), f"writing {_join(task.output_dir, task.filename)!r}",
                 written)


def _convert_shard(task: ShardTask, written: Ticks, reader: FileReader) -> str:
    plan = json.loads(_read_bytes(task.plan_file))
    if plan.get("fingerprint") != task.fingerprint:
        raise RuntimeError(f"{task.plan_file}: written for another plan of {task.filename}; run the conversion again")
    skipped: list[dict[str, Any]] = []
    repaired: list[dict[str, Any]] = []
    remote_input = plan.get("remote_input", False)
    with _shard_writer(_join(task.output_dir, task.filename)) as writer:
        for name, result in _judged_items(plan["items"], remote_input, task.schema, task.image_options, reader):
            if written.given_up:  # reported already: the thread left behind writes nothing more
                raise StorageError(f"writing {task.filename!r} was given up")
            written.count += 1
            if result[0] == "ok":
                writer.write_framed(result[1])
                if result[2]:
                    repaired.append(_file_entry(name, actions=list(result[2]), shard=task.filename))
            else:
                entry = _file_entry(name, reason=result[1])
                if result[2]:
                    entry["detail"] = result[2]
                skipped.append(entry)
        state: dict[str, Any] = {"fingerprint": task.fingerprint, "skipped": skipped, "repaired": repaired}

        def save_state(info: ShardInfo) -> None:
            state["shard"] = dataclasses.asdict(info)
            _write_json(_join(task.state_dir, f"{task.filename}.json"), state)

        info = writer.commit(before_rename=save_state)
    log.info("wrote %s: %d records, %d bytes", task.filename, info.records, info.bytes)
    return task.filename


# --- launcher side ---------------------------------------------------------------------------------------


def _write_plan_files(options: ConvertOptions, state_dir: Path | RemotePath,
                      pending: list[PlannedShard]) -> list[ShardTask]:
    """Each pending shard's item list, where every worker can read it: the local state folder, or
    the bucket's when the output is in one (a Dataflow worker never sees the launcher's disk)."""
    folder = state_dir / PLAN_DIR
    if isinstance(folder, RemotePath):
        def save(path, data):
            location.write_bytes(path, json.dumps(data).encode())
    else:
        shutil.rmtree(folder, ignore_errors=True)  # item lists of an earlier plan
        folder.mkdir()
        save = write_json_atomic
    remote_input = is_remote(str(options.dataset_path))
    root = location.as_path(options.dataset_path)
    tasks = []
    for shard in pending:
        items = [[os.fsencode(source_path(root, c.name)).hex(), c.name.hex(), c.label, os.fsencode(c.label_text).hex()]
                 for c in shard.items]
        save(folder / f"{shard.filename}.json", {"fingerprint": shard.fingerprint, "remote_input": remote_input, "items": items})
        tasks.append(ShardTask(shard.filename, shard.fingerprint, str(options.output_path), str(state_dir),
                               options.schema, options.image_options, options.read_ahead))
    return tasks


def run_pipeline(args: Sequence[str], tasks: list[ShardTask]) -> None:
    """One element per shard, spread over the workers (Reshuffle keeps the runner from fusing every
    shard onto the worker that read the list)."""
    beam = require_beam()
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.runner import PipelineState

    pipeline = beam.Pipeline(options=PipelineOptions(list(args)))
    _ = (
        pipeline
        | "shards" >> beam.Create(tasks, reshuffle=False)
        | "spread" >> beam.Reshuffle()
        | "convert" >> beam.Map(convert_shard)
    )
    try:
        state = pipeline.run().wait_until_finish()
    except Exception as exc:  # a worker's failure, as the runner reports it
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        raise DataError(f"the Beam pipeline failed ({first}); completed shards are kept, run the same command again to finish") from exc
    if state not in (PipelineState.DONE, None):
        raise DataError(f"the Beam pipeline ended {state}; completed shards are kept, run the same command again to finish")


def _saved_state(out: Path | RemotePath, state_dir: Path | RemotePath, shard: PlannedShard) -> dict[str, Any] | None:
    """The state a worker saved for `shard`, if it matches the plan and the shard it renamed into place."""
    try:
        state = json.loads(_state_path(state_dir, shard).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    info = state.get("shard", {})
    path = out / shard.filename
    if state.get("fingerprint") != shard.fingerprint or not path.is_file() or path.stat().st_size != info.get("bytes"):
        return None
    return state


def _finished_state(out: Path | RemotePath, state_dir: Path | RemotePath, shard: PlannedShard) -> dict[str, Any]:
    state = _saved_state(out, state_dir, shard)
    if state is None:
        raise DataError(f"{out / shard.filename}: the Beam pipeline finished without writing this shard as planned; "
                        "run the same command again")
    return state


def _listed_names(state_dir: Path | RemotePath) -> set[str]:
    """What the state folder holds now, from a fresh listing (never a cached one)."""
    if isinstance(state_dir, RemotePath):
        return set(location.backend(state_dir).list(state_dir).files)
    return set(os.listdir(state_dir))


@contextlib.contextmanager
def watching_shards(state_dir: Path | RemotePath, pending: list[PlannedShard], done: int, total: int,
                    progress: Progress | None) -> Iterator[None]:
    """While the block runs, `progress(images done, total)` each time the workers finish shards. A
    worker saves a shard's state just before renaming the shard into place, in the state folder every
    runner's workers write to, so the launcher counts them there whatever the runner (Beam's own
    metrics reach the launcher only on some runners, and only when the job ends on the DirectRunner).
    States that were there before the block are counted only when it ends."""
    if progress is None or not pending:
        yield
        return
    remote = isinstance(state_dir, RemotePath)
    interval = REMOTE_PROGRESS_POLL_S if remote else PROGRESS_POLL_S
    sizes = {_state_path(state_dir, shard).name: len(shard.items) for shard in pending}  # state name -> images
    stop = threading.Event()

    def count() -> set[str]:
        try:
            return _listed_names(state_dir)
        except (OSError, StorageError) as exc:  # progress only: the pipeline's own errors are what count
            log.debug("counting finished shards in %s: %s", state_dir, exc)
            return set()

    before = count()

    def watch() -> None:
        reported = done
        while not stop.wait(interval):
            finished = count() - before
            now = done + sum(n for name, n in sizes.items() if name in finished)
            if now > reported:
                progress(now, total)
                reported = now

    thread = threading.Thread(target=watch, name="stallscope-beam-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=interval + location.storage_timeout() if remote else interval + 5)


def _run_pending_shards(options: ConvertOptions, args: Sequence[str], plan, state_dir: Path | RemotePath,
                        reusable: Callable, progress: Progress | None = None) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """({shard: state} for every planned shard, the shards an earlier run had finished): the shards
    `reusable` does not vouch for are written by the pipeline; `progress(images done, total)` hears of
    the kept ones first, then of the workers' shards as they finish."""
    out = options.output_path
    results: dict[str, dict[str, Any]] = {}
    for shard in plan.shards:
        state = reusable(out, state_dir, shard)
        if state is not None:
            results[shard.filename] = state
    reused = set(results)
    pending = [s for s in plan.shards if s.filename not in results]
    total = len(plan.candidates)
    done = total - sum(len(s.items) for s in pending)
    if progress:
        progress(done, total)
    if pending:
        log.info("running %d shard(s) on Beam (%s); %d kept from an earlier run", len(pending), " ".join(args), len(reused))
        tasks = _write_plan_files(options, state_dir, pending)
        with watching_shards(state_dir, pending, done, total, progress):
            run_pipeline(args, tasks)
        location.forget_listings()  # in a bucket, the workers wrote objects this process has not seen
        for shard in pending:
            results[shard.filename] = _finished_state(out, state_dir, shard)
        if progress:
            progress(total, total)
    return results, reused


def convert_with_beam(options: ConvertOptions, args: Sequence[str] = (f"--runner={DEFAULT_RUNNER}",),
                      progress: Progress | None = None) -> ConvertReport:
    """`convert_tree`'s result, written by a Beam pipeline run with `args` (see `pipeline_args`);
    `progress(images done, total)` as the workers finish shards (see `watching_shards`)."""
    started = time.perf_counter()
    require_beam()
    if options.workers is not None:
        raise UsageError("--workers: sets the local runner's processes; with --runner beam expected "
                         "--beam-option --num_workers=N (Dataflow) or --beam-option --direct_num_workers=N")
    _check_reachable(options, _runner_name(args))
    plan = plan_conversion(options)
    out = options.output_path
    if isinstance(out, RemotePath):
        return _convert_into_store(options, args, plan, started, progress)
    guard = NetworkGuard.of(out)  # a shared network file system: the launcher's own steps there are bounded
    with claimed_output(options, plan.shards, guard) as state_dir:
        results, reused = _run_pending_shards(options, args, plan, state_dir, _reusable, progress)
        manifest = _build_manifest(options, plan.tree, plan.shards, results, plan.skipped)
        guard(lambda: save_manifest(out, manifest), f"writing {str(out / MANIFEST_NAME)!r}")
        guard.cleanup(lambda: shutil.rmtree(state_dir, ignore_errors=True), f"removing {str(state_dir)!r}")
    return _checked_report(options, plan, manifest, reused, started)


def _checked_report(options: ConvertOptions, plan, manifest, reused: set[str], started: float) -> ConvertReport:
    report = _report(options, manifest, plan.shards, reused, time.perf_counter() - started)
    out = options.output_path
    if report.examples == 0:
        raise DataError(
            f"dataset path {str(plan.tree.root)!r}: no usable images; all {len(plan.candidates)} file(s) in class "
            f"folders were skipped (reasons in {out / MANIFEST_NAME})"
        )
    return report


def _convert_into_store(options: ConvertOptions, args: Sequence[str], plan, started: float,
                        progress: Progress | None = None) -> ConvertReport:
    """The Beam convert into gs:// or s3://: the workers upload their shards themselves (no staging on
    the launcher, whose disk a cluster's workers never see). The bucket's copy keeps the local rules:
    objects convert did not write make it refuse before any work; the state (`run.json`: the shards
    this tool owns there; one state per written shard; the item lists) lives under the prefix's
    `.stallscope-convert/`; an earlier manifest goes first and the new one is written last, so an
    interrupted run never looks complete, and running the same command again reuses its finished shards."""
    from stallscope.records.remote_lock import bucket_lease
    from stallscope.records.remote_output import _remote_owned, check_remote_output

    out: RemotePath = options.output_path
    try:
        check_remote_output(out)
        if not options.replace:
            _refuse_another_conversion(options)
        owned, _ = _remote_owned(out)
        planned = {shard.filename for shard in plan.shards}
        command = " ".join([convert_command(options), "--runner beam",
                            *(f"--beam-option={shlex.quote(a)}" for a in args if a != f"--runner={DEFAULT_RUNNER}")])
        with bucket_lease(out, command) as lease:
            manifest, reused = _publish_into_store(options, args, plan, out, owned, planned, command, lease, progress)
    except StorageError as exc:
        if str(exc).startswith("--output_path"):
            raise
        raise StorageError(f"--output_path: {exc}") from None
    return _checked_report(options, plan, manifest, reused, started)


def _publish_into_store(options: ConvertOptions, args: Sequence[str], plan, out: RemotePath, owned: set[str],
                        planned: set[str], command: str, lease, progress: Progress | None = None):
    """Under the lease: state first, shards by the workers, then labels and manifest, state last; the
    lease is confirmed still ours before the state is written and before anything is removed or
    the manifest published."""
    from stallscope.records import sharding
    from stallscope.records.remote_lock import LOCK_OBJECT
    from stallscope.records.writer import is_temporary

    state_dir = out / STATE_DIR
    lease.confirm()
    location.write_bytes(state_dir / RUN_NAME, json.dumps({"command": command, "owned": sorted(owned | planned)}).encode())
    if (out / MANIFEST_NAME).exists():
        location.delete(out / MANIFEST_NAME)  # from here until the end the bucket's copy is unfinished
    results, reused = _run_pending_shards(options, args, plan, state_dir, _saved_state, progress)
    manifest = _build_manifest(options, plan.tree, plan.shards, results, plan.skipped)
    lease.confirm()  # the workers took hours, perhaps: another run may hold the prefix now
    for entry in list(out.iterdir()):
        stale_shard = entry.name in owned - planned and sharding.SHARD_NAME.match(entry.name)
        if entry.is_file() and (stale_shard or is_temporary(entry.name)):
            log.info("removing %s left by an earlier conversion", entry)
            location.delete(entry)
    with tempfile.TemporaryDirectory(prefix="stallscope-manifest-") as scratch:
        save_manifest(Path(scratch), manifest)
        location.upload_file(Path(scratch) / LABELS_NAME, out / LABELS_NAME)
        location.upload_file(Path(scratch) / MANIFEST_NAME, out / MANIFEST_NAME)  # last: now the copy is complete
    for entry in list(state_dir.walk_files()):
        if entry.name != LOCK_OBJECT:  # the lease goes when the block that holds it ends
            location.delete(entry)
    return manifest, reused
