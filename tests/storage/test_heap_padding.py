"""Heap padding: freed memory stays at the heap's top instead of being faulted back in, and a user's own
malloc settings are left alone. Each case runs in a fresh process: the setting is process-wide."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from stallscope.storage import heap_padding

# 20 rounds of 100 blocks of 100 KB (below malloc's mmap threshold, so on the heap), each written,
# then all freed: without padding every round's 10 MB is trimmed and faulted back in.
CHURN = """
import ctypes, resource, sys
from stallscope.storage.heap_padding import pad_heaps
print(pad_heaps())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def churn(rounds):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        blocks = [libc.malloc(100_000) for _ in range(100)]
        for block in blocks:
            ctypes.memset(block, 1, 100_000)
        for block in reversed(blocks):
            libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
churn(1)
print(churn(20))
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="M_TOP_PAD is glibc's malloc setting")


def churn(**env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if k not in heap_padding.USER_SETTINGS + (heap_padding.SWITCH_ENV,)}
    result = subprocess.run([sys.executable, "-c", CHURN], capture_output=True, text=True, timeout=60,
                            env={**clean, **env}, check=True)
    said, faults = result.stdout.split("\n")[:2]
    return said, int(faults)


@glibc_only
def test_padded_heaps_keep_freed_memory_instead_of_faulting_it_back():
    said, padded = churn()
    assert said == f"{heap_padding.TOP_PAD_BYTES >> 20} MB kept free per heap"
    off, unpadded = churn(**{heap_padding.SWITCH_ENV: "0"})
    assert off == f"malloc as configured ({heap_padding.SWITCH_ENV}=0)"
    assert unpadded > 20 * 1000  # each round's ~2,400 pages come back as faults
    assert padded < unpadded / 20


@glibc_only
def test_a_users_own_malloc_setting_is_left_alone():
    said, faults = churn(MALLOC_TRIM_THRESHOLD_="131072")
    assert said == "malloc as configured (MALLOC_TRIM_THRESHOLD_)"
    assert faults > 20 * 1000


@pytest.mark.parametrize("argv, padded", [
    (["--source", "records", "--dataset_path", "s3://b/records"], True),
    (["--source", "records", "--dataset_path", "gs://b/records", "--pipeline", "tuned"], True),  # the pooled reader
    (["--source", "records", "--dataset_path", "gs://b/records", "--pipeline", "seed"], False),  # TF's own client
    (["--source", "records", "--dataset_path", "gs://b/records", "--pipeline", "seed", "--gcs-reader", "pooled"], True),
    (["--source", "files", "--dataset_path", "s3://b/tree"], False),  # whole JPEGs: no stream of blocks
])
def test_the_cli_pads_the_heaps_wherever_stallscopes_reader_streams_records(argv, padded):
    """Before TensorFlow loads (padding set later, where the pipeline is built, has about half the
    effect): s3:// records, and gs:// records the pooled reader streams."""
    import importlib.util

    from stallscope.cli.flags import _records_streamed_by_stallscope
    from stallscope.cli.main import build_parser

    if "gs://" in argv[3] and importlib.util.find_spec("obstore") is None:
        padded = False  # no pooled reader: TF's client reads gs://
    args = build_parser().parse_args(["train", *argv])
    assert _records_streamed_by_stallscope(args) is padded
