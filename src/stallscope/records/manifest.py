"""`manifest.json`, written last beside the shards: what was converted, how, and what was not.

Readers (the pipeline, `verify`) use `load_manifest`; the converter builds a `Manifest` and saves it
atomically once every shard is in place.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from stallscope.errors import DataError
from stallscope.jsonfile import write_json_atomic  # noqa: F401 (its home; imported from here too)
from stallscope.storage.location import as_path

MANIFEST_NAME = "manifest.json"
LABELS_NAME = "labels.txt"
FORMAT = "stallscope-records"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    file: str  # relative to the records directory
    records: int
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    examples: int
    shards: tuple[ShardInfo, ...]


@dataclasses.dataclass(frozen=True)
class Manifest:
    schema: str
    labels: tuple[str, ...]
    splits: dict[str, SplitInfo]
    options: dict[str, Any]
    skipped: tuple[dict[str, str], ...] = ()   # {"path", "reason"}
    repaired: tuple[dict[str, Any], ...] = ()  # {"path", "actions": [...]}
    source: str = ""

    def shard_paths(self, records_dir: Path, split: str) -> list[Path]:
        if split not in self.splits:
            raise DataError(f"{records_dir}: no split {split!r} in {MANIFEST_NAME}; it has {', '.join(self.splits)}")
        return [as_path(records_dir) / s.file for s in self.splits[split].shards]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "source": self.source,
            "schema": self.schema,
            "labels": list(self.labels),
            "options": self.options,
            "splits": {
                name: {"examples": s.examples, "shards": [dataclasses.asdict(x) for x in s.shards]}
                for name, s in self.splits.items()
            },
            "skipped": list(self.skipped),
            "repaired": list(self.repaired),
        }

    @classmethod
    def from_json(cls, data: Any, *, where: str) -> "Manifest":
        if not isinstance(data, dict):
            raise DataError(f"{where}: not a stallscope manifest (a JSON {type(data).__name__}; expected an object)")
        if data.get("format") != FORMAT:
            raise DataError(f"{where}: not a stallscope manifest (format {data.get('format')!r})")
        try:
            splits = {
                name: SplitInfo(s["examples"], tuple(ShardInfo(**x) for x in s["shards"]))
                for name, s in data["splits"].items()
            }
            return cls(
                schema=data["schema"], labels=tuple(data["labels"]), splits=splits,
                options=data.get("options", {}), skipped=tuple(data.get("skipped", ())),
                repaired=tuple(data.get("repaired", ())), source=data.get("source", ""),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"{where}: malformed manifest ({exc.__class__.__name__}: {exc})") from None


def load_manifest(records_dir: Path | str) -> Manifest:
    path = as_path(records_dir) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: missing; is {str(records_dir)!r} a directory written by `stallscope convert`?") from None
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    return Manifest.from_json(data, where=str(path))


def save_manifest(records_dir: Path | str, manifest: Manifest) -> None:
    records_dir = Path(records_dir)
    labels_tmp = records_dir / f".{LABELS_NAME}.tmp-{os.getpid()}"
    labels_tmp.write_text("".join(f"{label}\n" for label in manifest.labels), encoding="utf-8")
    os.replace(labels_tmp, records_dir / LABELS_NAME)
    write_json_atomic(records_dir / MANIFEST_NAME, manifest.to_json())
