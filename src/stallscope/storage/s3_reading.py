"""How the s3:// reader issues its requests, without TensorFlow: shared by the reader (`readers.py`)
and the storage what-if, which must model the reader that really runs."""

from __future__ import annotations

# Reads in flight for an s3:// files source whose config leaves the read parallelism to TF (AUTOTUNE).
AUTOTUNE_IN_FLIGHT = 16
# Block size of a streamed s3:// shard: one request per this many bytes.
SHARD_BLOCK_BYTES = 16 * 1024 * 1024


def in_flight(parallelism: int | None) -> int:
    """Requests at once for a read of this parallelism: sequential (None) is one; AUTOTUNE is
    AUTOTUNE_IN_FLIGHT; a number is that number."""
    if parallelism is None:
        return 1
    return AUTOTUNE_IN_FLIGHT if parallelism < 0 else int(parallelism)
