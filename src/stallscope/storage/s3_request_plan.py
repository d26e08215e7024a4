"""How the s3:// reader issues its requests, without TensorFlow: shared by the reader (`tfdata_readers.py`)
and the storage what-if, which must model the reader that really runs."""

from __future__ import annotations

import os

from stallscope.errors import UsageError

# Which reader fetches s3:// objects (JPEGs, shards' blocks): obstore, unless this says s3fs.
READER_ENV = "STALLSCOPE_S3_READER"
READERS = ("obstore", "s3fs")

# Reads in flight for an s3:// files source whose config leaves the read parallelism to TF (AUTOTUNE).
AUTOTUNE_IN_FLIGHT = 16
# Requests fetched by one Python call of the pipeline (a group): the call's cost is shared by its images.
GROUP_REQUESTS = 16
# `stallscope.read_files`' fetching stage is named this, then its requests in flight: a diagnosis of a
# dataset of your own finds it in the graph.
READ_STAGE = "stallscope_read_"
RECORDS_STAGE = "s3_records"  # the name of the stage that hands a shard's records on, one by one (`readers`)
# Block size of a streamed s3:// shard: one request per this many bytes, after a first block of
# FIRST_BLOCK_BYTES (`readers.block_spans`).
SHARD_BLOCK_BYTES = 16 * 1024 * 1024
FIRST_BLOCK_BYTES = 4 * 1024 * 1024


def in_flight(parallelism: int | None) -> int:
    """Requests at once for a read of this parallelism: sequential (None) is one; AUTOTUNE is
    AUTOTUNE_IN_FLIGHT; a number is that number."""
    if parallelism is None:
        return 1
    return AUTOTUNE_IN_FLIGHT if parallelism < 0 else int(parallelism)


def groups_in_flight(requests: int) -> int:
    """Groups of GROUP_REQUESTS fetched at once for `requests` in flight: enough to hold them, and at
    least two (the next group is fetched while one is consumed), or one for sequential reads. Each
    holds a tf.data thread while it waits."""
    if requests <= 1:
        return 1
    return max(2, -(-requests // GROUP_REQUESTS))


def reader_name() -> str:
    """The reader s3:// objects are read with: obstore, unless STALLSCOPE_S3_READER says s3fs (the
    reader that runs, and the one the what-if models). Listings and writes are obstore's either way."""
    wanted = os.environ.get(READER_ENV, "").strip().lower()
    if wanted and wanted not in READERS:
        raise UsageError(f"{READER_ENV}: expected one of {', '.join(READERS)}, got {wanted!r}")
    return "s3fs" if wanted == "s3fs" else "obstore"
