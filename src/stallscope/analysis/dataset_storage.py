"""Storage per image and the storage what-if for a dataset of your own (`stallscope.diagnose`,
`diagnose --dataset-fn`): the same model `diagnose` runs on stallscope's pipeline, fed from what the
dataset's graph and files show (files or TFRecord shards, which reader, how many reads in flight)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from stallscope.analysis.storage_counters import StorageFigures, storage_figures
from stallscope.analysis.storage_whatif import (
    StorageScenario, StorageWhatIf, Workload, client_for_path, client_named, pattern_for, storage_whatif,
)
from stallscope.pipeline.config import PipelineConfig
from stallscope.storage.location import is_remote
from stallscope.storage.s3_reading import READ_STAGE

RECORD_OPS = {"TFRecordDataset", "TFRecordDatasetV2"}


@dataclasses.dataclass(frozen=True)
class ReadMap:
    """The map of a dataset of your own that reads files: its parallel calls (None: sequential) and
    whether it also decodes (one stage) or only reads (a stage of its own)."""

    calls: int | None
    decodes: bool


def source_format(ops: set[str], files: Sequence[str]) -> str:
    """"records" where the graph reads TFRecord shards (TF's reader, or files named like shards that
    stallscope.read_records streams), else "files" (one object per image)."""
    names = [str(f).rsplit("/", 1)[-1] for f in files]
    if ops & RECORD_OPS or (names and all(".tfrecord" in n or "-of-" in n for n in names)):
        return "records"
    return "files"


def dataset_storage(ops: set[str], files: Sequence[str], *, data_bytes: int, examples: int | None,
                    config: PipelineConfig, warm, parts, phase, scenarios: Sequence[StorageScenario] = (),
                    client: str | None = None, private_pool: int | None = None, reads: ReadMap | None = None
                    ) -> tuple[StorageFigures | None, StorageWhatIf | None, list[str]]:
    """(figures, what-if, notes). Where the dataset's images cannot be counted (records of a repeated
    dataset), nothing is predicted and a note says why."""
    kind = source_format(ops, files)
    images = len(files) if kind == "files" else examples
    if not files or not images or data_bytes <= 0:
        return None, None, ["storage what-if not made: the dataset's files and images are not known "
                            "(give files=, and a dataset that ends, for records)"]
    # TF's client reads where a tf.io.read_file or TFRecordDataset is in the graph; else stallscope's reader.
    gcs_reader = "tf" if ops & ({"ReadFile"} | RECORD_OPS) else "pooled"
    first = next((f for f in files if is_remote(f)), str(files[0]))
    client = client or client_for_path(first, gcs_reader)
    pattern = pattern_for(kind, examples=images, total_bytes=data_bytes, files=len(files))
    io = warm.io_per_image
    figures = storage_figures(pattern, client_named(client),
                              wait_ms_per_image=(parts.waiting_ms + parts.storage_ms) / config.batch_size,
                              read_calls=io.read_calls if io else None,
                              files_opened=io.files_opened if io else None)
    workload = Workload(cpu_ms_per_image=parts.cpu_ms_per_image, cores=max(1.0, warm.cores - warm.other_cores_busy),
                        compute_ms=phase.compute_ms, batch_size=config.batch_size, overlapped=phase.overlapped,
                        examples=images, machine_cores=warm.cores, chain_ms_per_image=warm.steady_ms_per_image)
    what = storage_whatif(pattern, as_read(config, ops, gcs_reader, private_pool, reads), workload,
                          scenarios=scenarios, object_client=client)
    return figures, what, []


def as_read(config: PipelineConfig, ops: set[str], gcs_reader: str, private_pool: int | None,
            reads: ReadMap | None = None) -> PipelineConfig:
    """The config with the reads the graph and options show: who reads gs://, the dataset's private
    pool, and a `stallscope.read_files` stage's requests in flight (its name ends with them), else the
    parallel calls of the map that reads with `tf.io.read_file`."""
    config = config.replace(gcs_reader=gcs_reader, private_threadpool_size=int(private_pool or 0))
    counts = [op[len(READ_STAGE):] for op in ops if op.startswith(READ_STAGE)]
    in_flight = [int(count) for count in counts if count.isdigit()]
    if in_flight:
        return config.replace(read_parallelism=max(in_flight))
    if reads is None:
        return config
    if reads.decodes:  # read inside the decode map: its parallelism is the reads'
        return config.replace(map_parallelism=reads.calls, read_parallelism=None)
    return config.replace(read_parallelism=reads.calls if reads.calls is not None else 1)
