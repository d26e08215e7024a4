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

import dataclasses
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stallscope.data import images
from stallscope.errors import DataError, UsageError
from stallscope.records.convert import (
    UNREADABLE, VANISHED, ConvertOptions, ConvertReport, PlannedShard, _build_manifest, _file_entry, _report,
    _reusable, _state_path, claimed_output, plan_conversion,
)
from stallscope.records.manifest import MANIFEST_NAME, ShardInfo, save_manifest, write_json_atomic
from stallscope.records.schema import get_schema
from stallscope.records.writer import ShardWriter, encode_example_bytes, frame_record

log = logging.getLogger(__name__)

# What `DirectRunner` runs a batch job on, minus its first try: downloading the Prism runner's binary.
DEFAULT_RUNNER = "FnApiRunner"
PLAN_DIR = "beam-plan"  # in the state folder: one item list per pending shard
INSTALL_HINT = "pip install 'stallscope[beam]' (or apache-beam)"
# Runners whose workers run on other machines and so can never see a path of this one.
REMOTE_ONLY_RUNNERS = ("dataflowrunner", "dataflow")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(path: str) -> bool:
    """`gs://bucket/x`, `s3://...`: a path Beam's FileSystems open, not the local file system."""
    return bool(_SCHEME.match(path)) and not path.startswith("file://")


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
                "expected a bucket path (gs://...)"
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

    @property
    def plan_file(self) -> str:
        return _join(self.state_dir, PLAN_DIR, f"{self.filename}.json")


def _join(base: str, *parts: str) -> str:
    if is_remote(base):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.join(base, *parts)
    return os.path.join(base, *parts)


def _read_bytes(path: bytes | str) -> bytes:
    if isinstance(path, str) and is_remote(path):
        from apache_beam.io.filesystems import CompressionTypes, FileSystems

        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:  # never by extension
            return handle.read()
    with open(path, "rb") as handle:
        return handle.read()


def convert_image(path: bytes | str, name: bytes, label: int, label_text: bytes, schema_name: str,
                  image_options: images.ImageOptions) -> tuple:
    """One image, as the local convert's workers judge it: ("ok", frame, actions) or ("skip", reason, detail)."""
    try:
        data = _read_bytes(path)
    except FileNotFoundError:
        return ("skip", VANISHED, "")
    except OSError as exc:
        return ("skip", UNREADABLE, f"{exc.__class__.__name__}: {exc.strerror or exc}")
    try:
        image = images.prepare_image(data, image_options)
    except images.UnusableImage as exc:
        return ("skip", exc.reason, exc.detail)
    payload = encode_example_bytes(
        get_schema(schema_name), image=image.data, label=label, filename=name, label_text=label_text,
        height=image.height, width=image.width,
    )
    return ("ok", frame_record(payload), image.actions)


class FileSystemsShardWriter:
    """`ShardWriter`'s contract (temporary name, commit renames, abort removes) through Beam's
    FileSystems, for output in a bucket. The temporary is named per attempt, so a retried or
    speculative copy of the same shard never writes into another's file."""

    def __init__(self, path: str) -> None:
        from apache_beam.io.filesystems import CompressionTypes, FileSystems

        self._fs = FileSystems
        self.path = path
        head, name = path.rsplit("/", 1)
        self._tmp = f"{head}/.{name}.tmp-{uuid.uuid4().hex[:12]}"
        self._handle = FileSystems.create(self._tmp, compression_type=CompressionTypes.UNCOMPRESSED)
        self._sha = hashlib.sha256()
        self.records = 0
        self.bytes = 0
        self._info: ShardInfo | None = None

    def write_framed(self, frame: bytes) -> None:
        self._handle.write(frame)
        self._sha.update(frame)
        self.records += 1
        self.bytes += len(frame)

    def commit(self, before_rename: Callable[[ShardInfo], None] | None = None) -> ShardInfo:
        self._handle.close()
        info = ShardInfo(file=self.path.rsplit("/", 1)[1], records=self.records, bytes=self.bytes,
                         sha256=self._sha.hexdigest())
        if before_rename is not None:
            before_rename(info)
        if self._fs.exists(self.path):  # an earlier attempt's identical shard: replace it
            self._fs.delete([self.path])
        self._fs.rename([self._tmp], [self.path])
        self._info = info
        return info

    def abort(self) -> None:
        if not self._handle.closed:
            self._handle.close()
        if self._fs.exists(self._tmp):
            self._fs.delete([self._tmp])

    def __enter__(self) -> "FileSystemsShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._info is None:
            self.abort()


def _write_json(path: str, data: Any) -> None:
    if not is_remote(path):
        write_json_atomic(Path(path), data)
        return
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    head, name = path.rsplit("/", 1)
    tmp = f"{head}/.{name}.tmp-{uuid.uuid4().hex[:12]}"
    with FileSystems.create(tmp, mime_type="application/json", compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(json.dumps(data, indent=2, ensure_ascii=True).encode() + b"\n")
    FileSystems.rename([tmp], [path])


def _shard_writer(path: str):
    return FileSystemsShardWriter(path) if is_remote(path) else ShardWriter(Path(path))


def convert_shard(task: ShardTask) -> str:
    """Writes one whole shard (the Beam worker's job): records under a temporary name, then the
    shard's state, then the rename. Returns the shard's file name."""
    plan = json.loads(_read_bytes(task.plan_file))
    if plan.get("fingerprint") != task.fingerprint:
        raise RuntimeError(f"{task.plan_file}: written for another plan of {task.filename}; run the conversion again")
    skipped: list[dict[str, Any]] = []
    repaired: list[dict[str, Any]] = []
    remote_input = plan.get("remote_input", False)
    with _shard_writer(_join(task.output_dir, task.filename)) as writer:
        for path_hex, name_hex, label, text_hex in plan["items"]:
            path: bytes | str = bytes.fromhex(path_hex)
            if remote_input:
                path = path.decode("utf-8", "surrogateescape")
            name = bytes.fromhex(name_hex)
            result = convert_image(path, name, label, bytes.fromhex(text_hex), task.schema, task.image_options)
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


def _write_plan_files(options: ConvertOptions, state_dir: Path, pending: list[PlannedShard]) -> list[ShardTask]:
    folder = state_dir / PLAN_DIR
    shutil.rmtree(folder, ignore_errors=True)  # item lists of an earlier plan
    folder.mkdir()
    remote_input = is_remote(str(options.dataset_path))
    tasks = []
    for shard in pending:
        items = [[os.fsencode(c.path).hex(), c.name.hex(), c.label, os.fsencode(c.label_text).hex()] for c in shard.items]
        write_json_atomic(folder / f"{shard.filename}.json",
                          {"fingerprint": shard.fingerprint, "remote_input": remote_input, "items": items})
        tasks.append(ShardTask(shard.filename, shard.fingerprint, str(options.output_path), str(state_dir),
                               options.schema, options.image_options))
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


def _finished_state(out: Path, state_dir: Path, shard: PlannedShard) -> dict[str, Any]:
    """The state a worker saved, checked against the plan and the shard it renamed into place."""
    try:
        state = json.loads(_state_path(state_dir, shard).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {}
    info = state.get("shard", {})
    path = out / shard.filename
    if state.get("fingerprint") != shard.fingerprint or not path.is_file() or path.stat().st_size != info.get("bytes"):
        raise DataError(f"{path}: the Beam pipeline finished without writing this shard as planned; run the same command again")
    return state


def convert_with_beam(options: ConvertOptions, args: Sequence[str] = (f"--runner={DEFAULT_RUNNER}",)) -> ConvertReport:
    """`convert_tree`'s result, written by a Beam pipeline run with `args` (see `pipeline_args`)."""
    started = time.perf_counter()
    require_beam()
    if options.workers is not None:
        raise UsageError("--workers: sets the local runner's processes; with --runner beam expected "
                         "--beam-option --num_workers=N (Dataflow) or --beam-option --direct_num_workers=N")
    _check_reachable(options, _runner_name(args))
    plan = plan_conversion(options)
    out = options.output_path
    with claimed_output(options, plan.shards) as state_dir:
        results: dict[str, dict[str, Any]] = {}
        for shard in plan.shards:
            state = _reusable(out, state_dir, shard)
            if state is not None:
                results[shard.filename] = state
        reused = len(results)
        pending = [s for s in plan.shards if s.filename not in results]
        if pending:
            log.info("running %d shard(s) on Beam (%s); %d kept from an earlier run", len(pending), " ".join(args), reused)
            run_pipeline(args, _write_plan_files(options, state_dir, pending))
            for shard in pending:
                results[shard.filename] = _finished_state(out, state_dir, shard)
        manifest = _build_manifest(options, plan.tree, plan.shards, results, plan.skipped)
        save_manifest(out, manifest)
        shutil.rmtree(state_dir, ignore_errors=True)
    report = _report(options, manifest, plan.candidates, reused, time.perf_counter() - started)
    if report.examples == 0:
        raise DataError(
            f"dataset path {str(plan.tree.root)!r}: no usable images; all {len(plan.candidates)} file(s) in class "
            f"folders were skipped (reasons in {out / MANIFEST_NAME})"
        )
    return report
