"""Is a records directory a finished conversion? Shared by `verify` and the training source.

A conversion writes its manifest last and removes its state folder after it, so a directory with
the state folder and no manifest is unfinished, and so is one whose shard names say `-of-00008` while
fewer are there. Either way its shards are not the data set, and reading them would silently train on
part of it.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

from stallscope.records.manifest import MANIFEST_NAME
from stallscope.records.sharding import SHARD_NAME
from stallscope.storage.location import as_path

STATE_DIR = ".stallscope-convert"  # the state of an unfinished conversion
RUN_NAME = "run.json"  # in STATE_DIR: the command that finishes it, and the shards it owns
FALLBACK_COMMAND = "the `stallscope convert` command that wrote it"


def read_run(records_dir: Path) -> dict:
    """The unfinished conversion's record (`command`, `owned`), or {} when there is none or it is unreadable."""
    try:
        data = json.loads((as_path(records_dir) / STATE_DIR / RUN_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def unfinished_conversion(records_dir: Path | str) -> str | None:
    """Why the directory's shards are not a complete set, naming the command that finishes them (without
    the directory's name); None when complete."""
    records_dir = as_path(records_dir)
    if (records_dir / MANIFEST_NAME).exists():
        return None  # the manifest is written last; verify checks the shards against it
    command = read_run(records_dir).get("command") or FALLBACK_COMMAND
    finish = f"run `{command}` again to finish it" if command != FALLBACK_COMMAND else f"run {command} again to finish it"
    if (records_dir / STATE_DIR).is_dir():
        return f"an unfinished conversion (its state folder {STATE_DIR} is there and no {MANIFEST_NAME}); {finish}"
    present: dict[tuple[str, int], set[int]] = collections.defaultdict(set)
    for entry in records_dir.iterdir():
        match = SHARD_NAME.match(entry.name)
        if match:
            present[(match["split"], int(match["total"]))].add(int(match["index"]))
    for (split, total), indices in sorted(present.items()):
        if len(indices) < total:
            first_missing = min(set(range(total)) - indices)
            return (
                f"split {split!r} has {len(indices)} of the {total} shards its names promise "
                f"(-of-{total:05d}; {split}-{first_missing:05d}-of-{total:05d}.tfrecord is missing); {finish}"
            )
    return None
