"""`convert` into a bucket: convert into a local staging folder, then publish it to gs:// or s3://.

The local conversion keeps its guarantees (same bytes for the same plan, resumable). Publishing keeps
the bucket's copy from ever looking complete while it is not: first a state object
(`.stallscope-convert/run.json`) records the shards this tool owns there, then the old manifest goes,
each shard is written under a temporary name and renamed, shards of an older conversion that the new
one has no place for are deleted (only those our manifest or state lists), and `manifest.json` is
written last. Objects convert did not write make it refuse, before any work, as for a local folder,
and so does another conversion holding the prefix's lease (`remote_lock.py`). Once the lease is held,
the temporary objects of a run that no longer writes (killed mid-upload) are deleted, as the local
path deletes its temporary files: only names of the `.NAME.tmp-PID` form that convert writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from stallscope.errors import StallscopeError, UsageError
from stallscope.records import sharding
from stallscope.records.completeness import RUN_NAME, STATE_DIR
from stallscope.records.manifest import LABELS_NAME, MANIFEST_NAME, load_manifest, save_manifest
from stallscope.records.remote_lock import LEASE_S, Lease, bucket_lease
from stallscope.records.writer import OutputFull, is_convert_temporary, is_temporary
from stallscope.storage import location
from stallscope.storage.location import RemotePath, StorageError

log = logging.getLogger(__name__)


def default_staging_root() -> Path:
    """Where outputs in a bucket are staged unless `--staging-dir` says: $XDG_CACHE_HOME (or ~/.cache)
    /stallscope/convert-staging."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stallscope" / "convert-staging"


def staging_dir(output: RemotePath, root: Path | None = None) -> Path:
    """A local folder per bucket location under `root` (default: `default_staging_root()`), kept until
    published, so an interrupted run resumes. It holds the whole output while it is converted."""
    digest = hashlib.sha256(str(output).encode()).hexdigest()[:16]
    return Path(root if root is not None else default_staging_root()) / digest


def _left_behind(local: Path, out: RemotePath) -> str:
    """What a failed run leaves, and until when: said in its one line."""
    return (f"the conversion so far stays in the staging folder {str(local)!r} (the same command resumes from it "
            f"and removes it once published); temporary objects left in {out} go with a rerun, and its lease, "
            f"where it could not be removed, with a rerun or after {LEASE_S:.0f} s")


def _remote_owned(out: RemotePath) -> tuple[set[str], dict[str, str]]:
    """(shard names our records say we wrote there, {shard: sha256} of its finished manifest)."""
    owned: set[str] = set()
    hashes: dict[str, str] = {}
    state = out / STATE_DIR / RUN_NAME
    if state.is_file():
        try:
            owned |= set(json.loads(state.read_text()).get("owned", []))
        except (ValueError, AttributeError):
            pass
    if (out / MANIFEST_NAME).is_file():
        try:
            manifest = load_manifest(out)
        except Exception:  # an unreadable manifest vouches for nothing
            manifest = None
        if manifest is not None:
            hashes = {s.file: s.sha256 for split in manifest.splits.values() for s in split.shards}
            owned |= set(hashes)
    return owned, hashes


def check_remote_output(out: RemotePath) -> None:
    """Refuses a bucket location holding anything `convert` did not write there."""
    if not out.exists():
        return
    if out.is_file():
        raise UsageError(f"--output_path: {out} is an object; expected a prefix (a folder) in a bucket")
    owned, _ = _remote_owned(out)
    foreign = []
    for entry in out.walk_files():
        rel = entry.relative_to(out).as_posix()
        name = entry.name
        ours = (rel in (MANIFEST_NAME, LABELS_NAME) or rel in owned or rel.startswith(f"{STATE_DIR}/")
                or ("/" not in rel and is_temporary(name)))
        if not ours:
            foreign.append(rel)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise UsageError(
            f"--output_path: {out} holds {foreign[0]!r}{more}, which `stallscope convert` did not write "
            f"(neither {MANIFEST_NAME} nor a conversion's state lists it); it is left alone; "
            "expected an empty or new prefix"
        )


def clear_temporaries(out: RemotePath) -> int:
    """Under the lease: deletes what a killed run left under temporary names (a shard, the manifest,
    the labels, the run's state), nothing else; returns how many."""
    if not out.exists():
        return 0
    removed = 0
    for entry in out.walk_files():
        rel = entry.relative_to(out).as_posix()
        top = "/" not in rel and is_convert_temporary(entry.name)
        state = rel.startswith(f"{STATE_DIR}/") and is_temporary(entry.name) and entry.name.startswith(f".{RUN_NAME}.tmp-")
        if top or state:
            log.info("removing %s, left unfinished by an earlier run", rel)
            location.delete(entry)
            removed += 1
    return removed


def publish(local: Path, out: RemotePath, command: str, lease: Lease) -> int:
    """Copies a finished local conversion to `out` (see the module docstring); returns the shards copied.
    The lease is confirmed still ours before the first write and before old shards are removed and
    the manifest published."""
    manifest = load_manifest(local)
    new = {s.file: s for split in manifest.splits.values() for s in split.shards}
    owned, old_hashes = _remote_owned(out)
    state = out / STATE_DIR / RUN_NAME
    lease.confirm()
    location.write_bytes(state, json.dumps({"command": command, "owned": sorted(owned | set(new))}).encode())
    if (out / MANIFEST_NAME).exists():
        location.delete(out / MANIFEST_NAME)  # from here until the end the bucket's copy is unfinished
    copied = 0
    for name, info in new.items():
        target = out / name
        if old_hashes.get(name) == info.sha256 and target.is_file() and target.stat().st_size == info.bytes:
            continue  # the same shard is there already
        location.upload_file(local / name, target)
        copied += 1
    lease.confirm()
    for name in sorted(owned - set(new)):
        if (out / name).exists() and sharding.SHARD_NAME.match(name):
            log.info("removing %s left by an earlier conversion", name)
            location.delete(out / name)
    location.upload_file(local / LABELS_NAME, out / LABELS_NAME)
    location.upload_file(local / MANIFEST_NAME, out / MANIFEST_NAME)  # last: now the copy is complete
    location.delete(state)
    return copied


def _with_note(exc: StallscopeError, note: str) -> StallscopeError:
    """The same kind of error (the same exit code), its one line followed by `note`."""
    try:
        return exc.__class__(f"{exc}; {note}")
    except TypeError:  # a kind built from more than its line
        return UsageError(f"{exc}; {note}")


def convert_to_store(options, progress=None, *, convert_local, command: str):
    """`convert_tree` for an output in a bucket: stage locally (`convert_local`, convert_tree itself), then
    publish; `command` is the conversion's command line (`convert_command`), which the bucket's lease names."""

    out = options.output_path
    with contextlib.ExitStack() as held:
        try:
            check_remote_output(out)
            lease = held.enter_context(bucket_lease(out, command))  # and proves the prefix takes writes
            clear_temporaries(out)
        except StorageError as exc:
            raise StorageError(f"--output_path: {exc}") from None
        local = staging_dir(out, options.staging_dir)
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--staging-dir: cannot make {str(local.parent)!r} ({exc.strerror or exc}); expected a "
                             f"local folder with room for the whole output of {out}") from None
        try:
            report = convert_local(dataclasses.replace(options, output_path=local, staging_dir=None), progress)
        except OutputFull as exc:
            raise UsageError(
                f"--output_path: {out} is staged first in the local folder {str(local)!r}, which is full ({exc.reason}); "
                "free space there or give --staging-dir a folder with room, and run the same command again "
                "(the shards completed so far are kept; the unfinished files were removed)") from None
        except StallscopeError as exc:
            raise _with_note(exc, _left_behind(local, out)) from None
        manifest = dataclasses.replace(report.manifest, options={**report.manifest.options, "output_path": str(out)})
        save_manifest(local, manifest)  # it records where the data set lives, not the staging folder
        try:
            copied = publish(local, out, command, lease)
        except StorageError as exc:
            raise StorageError(f"--output_path: {exc}; {_left_behind(local, out)}") from None
    shutil.rmtree(local, ignore_errors=True)
    log.info("published %d shard(s) to %s", copied, out)
    return dataclasses.replace(report, output_path=out, manifest=manifest)
