"""Storage per image and the storage what-if for a dataset of your own (`stallscope.diagnose`,
`diagnose --dataset-fn`): the same model `diagnose` runs on stallscope's pipeline, fed from what the
dataset's graph and files show (files or TFRecord shards, which reader, how many reads in flight)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from stallscope.analysis.differential import storage_model
from stallscope.analysis.storage_counters import StorageFigures
from stallscope.analysis.storage_whatif import (
    StorageScenario, StorageWhatIf, as_read_file_system, client_for_path, pattern_for,
)
from stallscope.pipeline.config import PipelineConfig
from stallscope.storage.location import is_remote
from stallscope.storage.request_tally import RequestTally
from stallscope.storage.under import FileRoundTrips, StorageUnder

RECORD_OPS = {"TFRecordDataset", "TFRecordDatasetV2"}


@dataclasses.dataclass(frozen=True)
class ReadMap:
    """The stage of a dataset of your own that reads files: its parallel calls (None: sequential;
    for `stallscope.read_files`, its requests in flight) and whether it also decodes (one stage) or
    only reads (a stage of its own)."""

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
                    client: str | None = None, private_pool: int | None = None, reads: ReadMap | None = None,
                    requests: RequestTally | None = None, round_trips: RequestTally | None = None,
                    bandwidth: float | None = None, records_alone=None, under: StorageUnder | None = None,
                    file_trips: FileRoundTrips | None = None,
                    server_cpu_ms_per_image: float = 0.0) -> tuple[StorageFigures | None, StorageWhatIf | None, list[str]]:
    """(figures, what-if, notes). Where the dataset's images cannot be counted (records of a repeated
    dataset), nothing is predicted and a note says why. `requests`: what stallscope's reader asked the
    store for during the warm probe (measured requests, bytes and request times); `round_trips`, `bandwidth`:
    one-byte GETs timed one at a time and the bytes/s of ranged GETs of shards, the store as read;
    `records_alone`: the shards read by one stream with no decode (`probes.ReadChain`), where timed.
    `under`, `file_trips`, `server_cpu_ms_per_image`: a network file system the files are on, its open and
    read timed one file at a time and its FUSE daemon's CPU per image: modelled as POSIX opens and reads
    at that round trip, as `diagnose` models one (`differential.storage_section`)."""
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
    networked = under is not None and under.kind == "network-fs"
    mount = as_read_file_system(file_trips.open_and_read_ms, file_trips.count, under.label, under.fstype) \
        if networked and file_trips is not None else None
    figures, what = storage_model(pattern, client, as_read(config, gcs_reader, private_pool, reads), warm, parts,
                                  phase, examples=images, scenarios=scenarios, requests=requests,
                                  in_store=is_remote(first) or networked, round_trips=round_trips,
                                  bandwidth=bandwidth, reads=records_alone,
                                  figures_client="network-fs" if networked else None, as_read=mount,
                                  server_cpu_ms_per_image=server_cpu_ms_per_image)
    return figures, what, []


def as_read(config: PipelineConfig, gcs_reader: str, private_pool: int | None,
            reads: ReadMap | None = None) -> PipelineConfig:
    """The config with the reads the graph and options show: who reads gs://, the dataset's private
    pool, and the reading stage's parallel calls (`stallscope.read_files`' requests in flight, or the
    map that calls `tf.io.read_file`)."""
    config = config.replace(gcs_reader=gcs_reader, private_threadpool_size=int(private_pool or 0))
    if reads is None:
        return config
    if reads.decodes:  # read inside the decode map: its parallelism is the reads'
        return config.replace(map_parallelism=reads.calls, read_parallelism=None)
    return config.replace(read_parallelism=reads.calls if reads.calls is not None else 1)
