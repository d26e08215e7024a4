"""`PipelineConfig`: every tf.data knob of the input pipeline, in one frozen, validated dataclass.

The builder (`builder.py`) turns a config plus a data source into a `tf.data.Dataset`. Presets
(`presets.py`) are named configs; CLI flags override single fields with `dataclasses.replace`.
AUTOTUNE is -1, as `tf.data.AUTOTUNE`.
"""

from __future__ import annotations

import dataclasses
import json
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

    preset: the preset this config started from (for reports only).
    batch_size, image_size: batch size and the square side images are resized to.
    shuffle_buffer: elements in the shuffle buffer; 0 disables shuffling (seed: 10240).
    shuffle_at: "decoded" shuffles decoded images after the map (the seeds' order: map -> shuffle
        -> batch; a buffer of 10240 images at 224 holds ~6 GB of float32), "encoded" shuffles file
        paths (files) or serialized records (records) before decode: same randomness, far less memory.
    shuffle_files: shuffle the order of image files / record shards each epoch (seeded) before reading.
    read_parallelism: records: shards read at once by a parallel `interleave` (None: shard after
        shard). files: files read at once; when None or equal to map_parallelism the read runs
        inside the decode map (as parallel as it), otherwise in a separate read map.
    interleave_cycle_length: records: shards open at once (defaults to read_parallelism when None).
    map_parallelism: `num_parallel_calls` of the decode map; None is a sequential map.
    prefetch: `prefetch` buffer at the end (batches); None means no prefetch.
    cache: "none", "memory" or "file" (then `cache_path`); cache_at: "encoded" bytes (after the
        read, before decode) or "decoded" images (after resize; memory-heavy, skips decode too).
    deterministic: keep element order in parallel stages (False lets fast elements overtake).
    private_threadpool_size: threads of a private pool for this pipeline; 0 uses TF's shared pool.
    max_intra_op_parallelism: intra-op threads per op; 0 leaves TF's default (the guide suggests 1).
    decode: "full" decode then resize, "crop" `decode_and_crop_jpeg` central crop, "scaled" DCT
        scaled decode (`ratio`) chosen so the image stays at least image_size.
    normalize: "minus_one_one" (seed: x / 127.5 - 1), "zero_one" or "none".
    autotune: tf.data's autotuner on or off (`options.autotune.enabled`).
    static optimisations (map_parallelization, ...): True/False forces TF's rewrite on or off;
        None keeps TF's default (most are on in TF 2.21 and silently parallelise a seed pipeline).
    drop_remainder: drop the last partial batch so every batch has the same shape.
    seed: shuffle seed, so runs repeat.
    data_service: a tf.data service dispatcher (HOST:PORT, see `stallscope serve`); when set, the
        pipeline up to the batch runs on the service's workers and this host only receives batches.
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
        if isinstance(data, dict) and "pipeline" in data and isinstance(data["pipeline"], dict):
            data = data["pipeline"]  # a file saved by `diagnose --fix` wraps the config
        return cls.from_dict(data, source=f"--pipeline-config {path}")


def describe_knob(value: int | None) -> str:
    """Renders a parallelism/buffer knob for people: 'autotune', 'off' or the number."""
    if value is None:
        return "off"
    return "autotune" if value == AUTOTUNE else str(value)
