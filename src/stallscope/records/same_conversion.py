"""Is the conversion an output folder holds the one asked for? A rerun of the same source and plan
resumes or repeats it; another source, shard plan or image option would replace it, which takes
`--replace` (issue: 64 earlier shards deleted for 4 of another source, with no word)."""

from __future__ import annotations

from typing import Any

from stallscope.errors import UsageError
from stallscope.records.manifest import Manifest

# The recorded options that decide the shards' bytes and names (not where, nor how many workers).
DECIDING = ("schema", "size_per_record", "shards", "split_shards", "max_side", "jpeg_quality", "max_pixels",
            "check", "seed", "follow_links")


def differences(manifest: Manifest, source: str, recorded: dict[str, Any]) -> list[str]:
    """What differs between the finished conversion `manifest` describes and one of `source` with the
    `recorded` options (as its manifest would record them), each as 'NAME NEW (was OLD)'."""
    found = []
    if manifest.source and manifest.source != source:
        found.append(f"source {source!r} (was {manifest.source!r})")
    for name in DECIDING:
        if name not in manifest.options:
            continue  # a manifest written before the option existed
        old, new = _comparable(manifest.options[name]), _comparable(recorded.get(name))
        if old != new:
            found.append(f"{name.replace('_', '-')} {_shown(new)} (was {_shown(old)})")
    return found


def refuse_other_conversion(where: str, manifest: Manifest, source: str, recorded: dict[str, Any]) -> None:
    """A one-line UsageError where the folder's finished conversion is not the one asked for."""
    changed = differences(manifest, source, recorded)
    if not changed:
        return
    shards = sum(len(split.shards) for split in manifest.splits.values())
    examples = sum(split.examples for split in manifest.splits.values())
    raise UsageError(
        f"--output_path: {where} holds a finished conversion ({shards} shard(s), {examples} images) that this "
        f"one would replace: {'; '.join(changed)}; expected the same source and options to resume or repeat "
        "it, another --output_path, or --replace to replace it")


def refuse_other_unfinished(where: str, earlier_command: str, command: str) -> None:
    """The same for an unfinished conversion, whose state names the command that finishes it."""
    if earlier_command and earlier_command != command:
        raise UsageError(
            f"--output_path: {where} holds an unfinished conversion of another source or plan (`{earlier_command}` "
            "finishes it) that this one would replace; expected that command, another --output_path, or --replace")


def _comparable(value: Any) -> Any:
    return [list(v) if isinstance(v, (list, tuple)) else v for v in value] if isinstance(value, (list, tuple)) else value


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return ",".join(f"{split}={count}" for split, count in value) or "none"
    return str(value)
