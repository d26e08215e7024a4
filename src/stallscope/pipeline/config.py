"""`PipelineConfig`: every tf.data knob of the input pipeline, in one frozen, validated dataclass.

The builder (`builder.py`) turns a config plus a data source into a `tf.data.Dataset`. Presets
(`presets.py`) are named configs; CLI flags override single fields with `dataclasses.replace`.
AUTOTUNE is -1, as `tf.data.AUTOTUNE`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from stallscope.config import (
    AUTOTUNE,
    from_dict,
    require_choice,
    require_non_negative,
    require_positive,
    to_dict,
)
from stallscope.errors import UsageError

CACHE_CHOICES = ("none", "memory", "file")
CACHE_AT_CHOICES = ("encoded", "decoded")
DECODE_CHOICES = ("full", "crop", "scaled")
NORMALIZE_CHOICES = ("minus_one_one", "zero_one", "none")
SHUFFLE_AT_CHOICES = ("decoded", "encoded")
GCS_READER_CHOICES = ("tf", "pooled")
# TF's static graph rewrites that change what the user wrote; None leaves TF's default.
STATIC_OPTIMIZATIONS = (
    "map_parallelization",
    "inject_prefetch",
    "map_and_batch_fusion",
    "parallel_batch",
    "map_fusion",
    "noop_elimination",
    "shuffle_and_repeat_fusion",
)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """The input pipeline, stage by stage.

    One entry per field, `name: meaning`: `stallscope train --help` and the README's knob table are
    made from these entries (`knob_docs`), so they are the one place a knob is explained. In Python
    a knob that is "off" is None, and "autotune" is AUTOTUNE (-1).

    preset: the preset this config started from (for reports only).
    batch_size: images per batch.
    image_size: the square side, in pixels, images are resized to.
    shuffle_buffer: elements in the shuffle buffer; 0 disables shuffling (the seeds: 10240).
    shuffle_at: where the shuffle sits: "decoded" shuffles decoded images after the map (the seeds'
        order map -> shuffle -> batch; 10240 images at 224 hold ~6 GB of float32), "encoded"
        shuffles file paths or serialized records before decode (as random, far less memory).
    shuffle_files: shuffle the order of image files / record shards each epoch (seeded) before reading.
    read_parallelism: records: shards read at once by a parallel interleave (off: shard after
        shard). files: files read at once; off or equal to map_parallelism reads inside the decode
        map (as parallel as it), otherwise in a separate read map.
    interleave_cycle_length: records: shards open at once (off: as many as read_parallelism).
    map_parallelism: parallel calls of the decode map (`num_parallel_calls`); off is a sequential map.
    prefetch: batches prefetched at the end of the pipeline; off means no prefetch.
    cache: keep elements after the first epoch: "none", "memory", or "file" (then cache_path).
    cache_at: what the cache keeps: "encoded" bytes (after the read, before decode) or "decoded"
        images (after resize; memory-heavy, skips the decode too).
    cache_path: with cache "file": the cache's file name prefix, in a folder that exists.
    deterministic: keep element order in parallel stages (false lets fast elements overtake).
    private_threadpool_size: threads of a private pool for this pipeline; 0 uses TF's shared pool.
    max_intra_op_parallelism: intra-op threads per op; 0 leaves TF's default (the guide suggests 1).
    decode: "full" decodes then resizes, "crop" decodes a central crop (`decode_and_crop_jpeg`),
        "scaled" decodes at a reduced DCT scale that keeps the image at least image_size.
    normalize: pixel scaling in the pipeline: "minus_one_one" (the seeds: x / 127.5 - 1),
        "zero_one", or "none" (0..255; the model's first layer scales them on the device).
    autotune: tf.data's autotuner on or off (`options.autotune.enabled`).
    map_parallelization: TF's rewrite that makes a sequential map parallel: true, false, or TF's default (on).
    inject_prefetch: TF's rewrite that adds a prefetch at the end: true, false, or TF's default (on).
    map_and_batch_fusion: TF's rewrite that fuses map and batch into one parallel stage: true, false,
        or TF's default (on).
    parallel_batch: TF's rewrite that batches in parallel: true, false, or TF's default (on).
    map_fusion: TF's rewrite that fuses consecutive maps: true, false, or TF's default (off).
    noop_elimination: TF's rewrite that drops stages that do nothing: true, false, or TF's default (on).
    shuffle_and_repeat_fusion: TF's rewrite that fuses shuffle and repeat: true, false, or TF's
        default (on).
    drop_remainder: drop the last partial batch so every batch has the same shape.
    seed: shuffle seed, so runs repeat.
    data_service: a tf.data service dispatcher HOST:PORT (see `stallscope serve`); the pipeline up
        to the batch runs on the service's workers and this host only receives batches.
    gcs_reader: who reads gs:// data: "tf", TF's own client (`tf.io.read_file`, `TFRecordDataset`; a
        new TCP+TLS connection per request), or "pooled", stallscope's reader on obstore (JPEGs
        fetched in groups over connections it keeps open, shards streamed in 16 MiB blocks), as
        s3:// data always is.
    """

    preset: str = "custom"
    batch_size: int = 32
    image_size: int = 224
    shuffle_buffer: int = 10240
    shuffle_at: str = "decoded"
    shuffle_files: bool = False
    read_parallelism: int | None = None
    interleave_cycle_length: int | None = None
    map_parallelism: int | None = None
    prefetch: int | None = None
    cache: str = "none"
    cache_at: str = "encoded"
    cache_path: str = ""
    deterministic: bool = True
    private_threadpool_size: int = 0
    max_intra_op_parallelism: int = 0
    decode: str = "full"
    normalize: str = "minus_one_one"
    autotune: bool = True
    map_parallelization: bool | None = None
    inject_prefetch: bool | None = None
    map_and_batch_fusion: bool | None = None
    parallel_batch: bool | None = None
    map_fusion: bool | None = None
    noop_elimination: bool | None = None
    shuffle_and_repeat_fusion: bool | None = None
    drop_remainder: bool = True
    seed: int = 0
    data_service: str = ""
    gcs_reader: str = "tf"

    def __post_init__(self) -> None:
        require_positive("batch_size", self.batch_size)
        require_positive("image_size", self.image_size)
        require_non_negative("shuffle_buffer", self.shuffle_buffer)
        require_choice("shuffle_at", self.shuffle_at, SHUFFLE_AT_CHOICES)
        for name in ("shuffle_files", "deterministic", "autotune", "drop_remainder"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        for name in ("shuffle_buffer", "private_threadpool_size", "max_intra_op_parallelism", "seed"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int):
                raise UsageError(f"{name}: expected an integer, got {getattr(self, name)!r}")
        require_positive("read_parallelism", self.read_parallelism, allow_none=True, allow_autotune=True)
        require_positive("interleave_cycle_length", self.interleave_cycle_length, allow_none=True, allow_autotune=True)
        require_positive("map_parallelism", self.map_parallelism, allow_none=True, allow_autotune=True)
        require_positive("prefetch", self.prefetch, allow_none=True, allow_autotune=True)
        require_choice("cache", self.cache, CACHE_CHOICES)
        require_choice("cache_at", self.cache_at, CACHE_AT_CHOICES)
        if self.cache == "file" and not self.cache_path:
            raise UsageError("cache_path: cache='file' needs a path, got ''")
        require_non_negative("private_threadpool_size", self.private_threadpool_size)
        require_non_negative("max_intra_op_parallelism", self.max_intra_op_parallelism)
        require_choice("decode", self.decode, DECODE_CHOICES)
        require_choice("normalize", self.normalize, NORMALIZE_CHOICES)
        require_choice("gcs_reader", self.gcs_reader, GCS_READER_CHOICES)
        if self.data_service:
            from stallscope.service.servers import normalize_address

            object.__setattr__(self, "data_service", normalize_address(self.data_service))
        for name in STATIC_OPTIMIZATIONS:
            value = getattr(self, name)
            if value not in (None, True, False):
                raise UsageError(f"{name}: expected true, false or none, got {value!r}")

    def replace(self, **changes: Any) -> "PipelineConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "pipeline config") -> "PipelineConfig":
        return from_dict(cls, data, source=source)

    def save(self, path: Path | str) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path | str) -> "PipelineConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(f"--pipeline-config: file {str(path)!r} does not exist") from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"--pipeline-config: {str(path)!r} is not valid JSON ({exc})") from None
        except UnicodeDecodeError as exc:  # a program, an image: JSON is UTF-8 text
            raise UsageError(f"--pipeline-config: {str(path)!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                             f"at offset {exc.start}); expected a JSON pipeline config") from None
        except IsADirectoryError:
            raise UsageError(f"--pipeline-config: {str(path)!r} is a directory; "
                             "expected a JSON pipeline config") from None
        if isinstance(data, dict) and "pipeline" in data and isinstance(data["pipeline"], dict):
            data = data["pipeline"]  # a file saved by `diagnose --fix` wraps the config
        return cls.from_dict(data, source=f"--pipeline-config {path}")


_DOC_ENTRY = re.compile(r"^    ([a-z_]+): (.*)$")


def knob_docs() -> dict[str, str]:
    """{field: its meaning}, one line each, read from PipelineConfig's docstring."""
    docs: dict[str, str] = {}
    name = None
    for line in (PipelineConfig.__doc__ or "").splitlines():
        entry = _DOC_ENTRY.match(line)
        if entry:
            name = entry.group(1)
            docs[name] = entry.group(2).strip()
        elif name is not None and line.startswith("        "):
            docs[name] += " " + line.strip()
        else:
            name = None
    return docs


def describe_knob(value: int | None) -> str:
    """Renders a parallelism/buffer knob for people: 'autotune', 'off' or the number."""
    if value is None:
        return "off"
    return "autotune" if value == AUTOTUNE else str(value)
