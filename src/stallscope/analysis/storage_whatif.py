"""Storage what-if: images/s and input share of a pipeline whose data sits behind a per-request
latency and a bandwidth cap, from the I/O pattern and CPU per image measured locally. Pure arithmetic.

Local read calls do not carry over to remote requests (a JPEG is ~2 local reads but 1 ranged GET;
a TFRecord image is 0.44 local reads but 0.008 GETs), so requests are modelled from what does carry
over: objects opened, bytes per image and the client's block size (`StorageClient`).

Per image, with r requests, L latency, s per-request overhead (client and server work, measured at
0 ms latency), b bytes, B bandwidth and d CPU per image (decode, the client's transfer and request work):

    sequential  rate = 1 / ((r + k h) L + r s + b / B + d)
    parallel    rate = min(C / ((r + k h) L + r s), cores / d, B / b)

k is connections opened per image and h the round trips a new connection takes before its first
request (TCP or a proxy's CONNECT, then TLS 1.3: 2): TF's gs:// opens one per request, so each GET
waits 3 latencies, not 1 (the storage emulator, benchmarks/storage.py: 3.2 latencies per JPEG at
10 and 30 ms); pooled clients open a few per run, so their k h L vanishes on a long run.

In the sequential chain, d's own part (the decode) is at most the pipeline's measured local pace per
image (the warm probe after its first batch): its CPU per image also counts TF's threads beside the
chain. s beyond the client's CPU is the store's own time, spent on another machine by a real store
and on these cores by an emulator here (`server_cpu_ms_per_request` moves it from the wait into d).

C is the requests really in flight: a stage's parallel calls run on a thread pool (tf.data's shared
pool has as many threads as cores; `private_threadpool_size` gives a pipeline its own), and a thread
that also decodes holds a request only part of the time, so `num_parallel_calls=16` on 2 shared
threads keeps ~1.7 requests in flight, not 16 (measured: 118 vs 121 images/s at 10 ms); where the
wait is short beside the decode C falls below one, and C / wait is then T / (wait + d).
The input share comes from the overlap model of `whatif.predict` against the device's step time.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from stallscope.analysis import whatif
from stallscope.config import AUTOTUNE
from stallscope.errors import UsageError
from stallscope.pipeline.config import PipelineConfig
from stallscope.pipeline.presets import NETWORK_FS, tuned_for_store
from stallscope.storage import gcs_obstore, s3_request_plan
from stallscope.storage.request_tally import RequestTally

MIB = 1024**2
FORMATS = ("files", "records")
READ_MODES = ("sequential", "parallel", "enough_in_flight")
DEFAULT_SHARD_BYTES = 52_428_800  # what `stallscope convert` writes by default (seed-000: 50 MiB)
RECORD_FRAMING_BYTES = 16         # TFRecord length + 2 CRCs per record
GCS_BLOCK_ENV = "GCS_READ_CACHE_BLOCK_SIZE_MB"
TF_GCS_DEFAULT_BLOCK_MB = 64      # tensorflow/tsl gcs_file_system.cc kDefaultBlockSize
S3FS_DEFAULT_BLOCK = 5 * MIB      # s3fs S3FileSystem.default_block_size (fsspec's default too)
NFS_BLOCK = MIB                   # Linux NFS client rsize/wsize ceiling (1 MiB)
FUSE_BLOCK = 128 * 1024           # Linux FUSE's default largest read (32 pages): a request to the daemon each


@dataclasses.dataclass(frozen=True)
class StorageClient:
    """How one reader turns objects opened and bytes into requests, and what a request costs it.

    block_bytes: the most bytes one request asks for (ranged GET, NFS READ).
    requests_per_open: requests per object before its data (HEAD / stat / NFS OPEN), 0 for none.
    request_overhead_ms: s, per request beyond the latency (client and server work); the model's
        default when it was not measured at 0 ms latency.
    request_cpu_ms: the part of s this host's CPU does (it competes with decoding for the cores).
    transfer_cpu_ms_per_mib: this host's CPU per MiB received (TLS, copies).
    new_connection_per_request: opens a TCP(+TLS) connection per request (no reuse).
    handshake_round_trips: h, round trips a new connection takes before its first request.
    block_buffer_cpu_ms_per_mib: CPU per MiB of block a streamed read (a reader that takes an object
        in pieces: TFRecord shards) allocates per request; a whole-object read (tf.io.read_file,
        which knows the size) allocates only what it receives (in transfer_cpu_ms_per_mib).
    """

    name: str
    block_bytes: int
    requests_per_open: int
    request_overhead_ms: float
    request_cpu_ms: float
    transfer_cpu_ms_per_mib: float
    new_connection_per_request: bool
    description: str
    handshake_round_trips: int = 2
    block_buffer_cpu_ms_per_mib: float = 0.0
    # A shard streamed in pieces (records), where the client reads it its own way: requests before its
    # data (s3fs's open asks for the size: a HEAD), its block size (0: block_bytes) and its first block's
    # (0: the same).
    streamed_requests_per_open: int = 0
    streamed_block_bytes: int = 0
    streamed_first_block_bytes: int = 0
    # JPEGs are fetched in groups (stallscope's s3:// reader): `num_parallel_calls` sets the requests in
    # flight directly, in groups of up to GROUP_REQUESTS, each group holding a pool thread while it waits.
    grouped_reads: bool = False
    # The store's URL scheme ("gs", "s3"; "file" for a file system): which store's tuned reads apply.
    scheme: str = "file"
    # stallscope's own reader (s3://, pooled gs://): it repeats a shard list and the pipeline shuffles a
    # window of the stream, where TF's readers end each epoch (see `refills_from_storage`).
    own_reader: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.block_bytes, int) and self.block_bytes > 0):
            raise UsageError(f"block_bytes: expected a positive integer, got {self.block_bytes!r}")
        for name in ("requests_per_open", "request_overhead_ms", "request_cpu_ms", "transfer_cpu_ms_per_mib",
                     "block_buffer_cpu_ms_per_mib", "streamed_requests_per_open", "streamed_block_bytes",
                     "streamed_first_block_bytes"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise UsageError(f"{name}: expected a finite number >= 0, got {value!r}")

    def requests_per_object(self, object_bytes: float) -> int:
        """Requests to read one object of `object_bytes` start to end."""
        return self.requests_per_open + max(1, math.ceil(object_bytes / self.block_bytes - 1e-9))

    def requests_per_streamed_object(self, object_bytes: float) -> int:
        """Requests to stream one shard of `object_bytes` start to end."""
        block = self.streamed_block_bytes or self.block_bytes
        rest = object_bytes - min(self.streamed_first_block_bytes or block, block)
        blocks = 1 + (math.ceil(rest / block - 1e-9) if rest > 0 else 0)
        return self.requests_per_open + self.streamed_requests_per_open + blocks


def tf_gcs_client(block_mb: float | None = None, environ: Mapping[str, str] | None = None) -> StorageClient:
    """TF's own `gs://`: one ranged GET per block (GCS_READ_CACHE_BLOCK_SIZE_MB, default 64 MB) and a
    new TCP+TLS connection per request (2 round trips before the GET). Its read buffer costs ~0.71 ms
    of CPU per MB (tensorflow/tensorflow#30327): per MB of block for a streamed read (a TFRecord shard
    read in pieces: ~46 ms per GET at 64 MB; the storage emulator: 438 vs 1633 images/s locally at
    0 ms with 32 images per shard), per MB received for a whole-object read (which knows the size).

    Connection and request work, from `tf.io.read_file` one object at a time on the storage emulator
    at 0 ms with 1 MB blocks (4 KB, 73 KB and 391 KB objects, 300 each): the client's CPU is 0.70 ms
    per request and 0.75 ms per MiB received, and each read takes 1.21 ms beyond its bytes (the
    client's work, the store's, and the loopback round trips of TCP, CONNECT and TLS). These were
    2.1 ms and 5.7 ms per MiB when the emulator relayed every connection through a thread of its own."""
    if block_mb is None:
        text = (os.environ if environ is None else environ).get(GCS_BLOCK_ENV, "")
        try:
            block_mb = float(text) if text.strip() else TF_GCS_DEFAULT_BLOCK_MB
        except ValueError:
            raise UsageError(f"{GCS_BLOCK_ENV}: expected a number of MB, got {text!r}") from None
    if not (block_mb > 0 and math.isfinite(block_mb)):
        raise UsageError(f"{GCS_BLOCK_ENV}: expected a number of MB above 0, got {block_mb!r}")
    return StorageClient(
        name="tf-gcs", block_bytes=int(block_mb * MIB), requests_per_open=0,
        request_overhead_ms=1.21, request_cpu_ms=0.70, transfer_cpu_ms_per_mib=0.75,
        new_connection_per_request=True, handshake_round_trips=2, block_buffer_cpu_ms_per_mib=0.711, scheme="gs",
        description=f"TF's gs:// ({block_mb:g} MB blocks, a new connection per request)")


def s3fs_client() -> StorageClient:
    """stallscope's s3:// reader on fsspec/s3fs, over pooled connections (aiobotocore keeps them).
    ~0.8 ms of Python per request (signing, aiohttp, botocore's parsing) and 2.5 per MiB: a 75 KB JPEG
    cost ~1.0 ms of CPU more than from local disk in `STALLSCOPE_S3_READER=s3fs python
    benchmarks/storage.py --store s3 --formats files --presets tuned --latencies 0,10` (1,051 against
    2,464 images/s at 0 ms), 0.58 ms per GET in a bare loop (benchmarks/s3_reader.py); an earlier
    emulator and machine gave 2.0-2.5 ms, so these are this machine's figures, not a constant.
    JPEGs: one GET per object, in groups of requests in flight on s3fs's event loop. Shards: a 4 MiB
    ranged GET, then 16 MiB ones, the next asked for while one is parsed, the size taken from the
    listing the run made (a HEAD before only where the process holds none). ~2.5 ms of CPU per MiB
    received: a shard through the checking generator costs 1.0-1.2 ms per MiB, and handing its records
    to tf.data in groups about as much again (a whole JPEG fetched costs 0.6-0.8)."""
    return StorageClient(
        name="s3fs", block_bytes=S3FS_DEFAULT_BLOCK, requests_per_open=0, request_overhead_ms=0.8,
        request_cpu_ms=0.8, transfer_cpu_ms_per_mib=2.5, new_connection_per_request=False,
        streamed_requests_per_open=0, streamed_block_bytes=s3_request_plan.SHARD_BLOCK_BYTES,
        streamed_first_block_bytes=s3_request_plan.FIRST_BLOCK_BYTES, grouped_reads=True,
        scheme="s3", own_reader=True, description="stallscope's s3:// reader on s3fs (pooled connections; shards in 16 MiB blocks)")


def obstore_client() -> StorageClient:
    """stallscope's s3:// reader where obstore is installed: GETs on a pool of request threads, outside
    the GIL, ~0.1 ms of this process's CPU per 75 KB JPEG handed to tf.data (tuned files through the
    storage emulator at 0 ms against local disk, less the store's own 0.10 ms per request:
    `python benchmarks/storage.py --store s3 --formats files`; 0.08 ms per GET in a bare loop of 16 in
    flight, benchmarks/s3_reader.py): 0.04 per request and 1.0 per MiB. An earlier threaded emulator and
    a slower machine gave 0.16-0.35 ms. Shards as in `s3fs_client` (4 MiB, then 16 MiB blocks, one
    asked for ahead): few requests, ~1.0 ms of CPU per MiB received, checked and handed to tf.data (records
    read into tf.data cost 0.20-0.23 ms of CPU per 75 KB record, against 0.14-0.21 from local disk,
    with obstore's blocks read in place and malloc's heaps padded; 0.40-0.49 before either, when
    the transfer cost was kept at s3fs's)."""
    return dataclasses.replace(
        s3fs_client(), name="obstore", request_overhead_ms=0.25, request_cpu_ms=0.04, transfer_cpu_ms_per_mib=1.0,
        description="stallscope's s3:// reader on obstore (pooled connections; shards in 16 MiB blocks)")


def obstore_gcs_client() -> StorageClient:
    """stallscope's pooled gs:// reader (`gcs_reader="pooled"`): obstore's GETs over kept-alive TLS
    connections, JPEGs in groups and shards in blocks as for s3:// (`obstore_client`). Read one object
    at a time through the storage emulator at 0 ms (4 KB, 73 KB and 391 KB objects, 300 each), this
    process's CPU is 0.09-0.12 ms per request and 2-3.6 ms per MiB, each read 0.23 ms beyond its bytes;
    16 MiB blocks of a shard cost 1.3-1.7 ms of CPU per MiB against 0.3-0.4 through s3:// on the same
    store without TLS, so TLS adds ~1.2 ms per MiB to the s3:// reader's 1.0 (which includes checking
    and handing records to tf.data). A 75 KB JPEG: ~0.27 ms of CPU, against ~0.75 through TF's gs://,
    which also makes the store do a TLS handshake per request."""
    return dataclasses.replace(
        obstore_client(), name="obstore-gcs", request_overhead_ms=0.23, request_cpu_ms=0.12,
        transfer_cpu_ms_per_mib=2.2, scheme="gs",
        description="stallscope's gs:// reader on obstore (kept-alive TLS connections; shards in 16 MiB blocks)")


def posix_client() -> StorageClient:
    """A file system (local disk, NFS): one open (LOOKUP/OPEN) and one READ per MiB; one mount connection."""
    return StorageClient(
        name="posix", block_bytes=NFS_BLOCK, requests_per_open=1, request_overhead_ms=0.05,
        request_cpu_ms=0.02, transfer_cpu_ms_per_mib=0.3, new_connection_per_request=False, handshake_round_trips=0,
        description="a file system (one open and one read per MiB)")


def network_fs_client() -> StorageClient:
    """A network file system (NFS, SMB, a FUSE mount such as gcsfuse or mountpoint-s3): POSIX opens and
    reads, each a round trip to the server (LOOKUP/OPEN, then a READ per MiB), over one mount connection;
    `tuned` keeps reads in flight on it as on a bucket (`presets.NETWORK_FS`)."""
    return dataclasses.replace(posix_client(), name="network-fs", scheme=NETWORK_FS,
                               description="a network file system (one open and one read per MiB, each a round trip)")


CLIENTS = {"tf-gcs": tf_gcs_client, "obstore-gcs": obstore_gcs_client, "s3fs": s3fs_client, "obstore": obstore_client,
           "posix": posix_client, "network-fs": network_fs_client}
# The client each kind of scenario is read with (an object store's: the one the diagnosis models).
SCENARIO_CLIENTS = {"filesystem": "posix", "network-fs": "network-fs"}


def obstore_client_for(scheme: str) -> StorageClient:
    """The obstore client of a store's scheme ("gs" or "s3"): the one that makes and times stallscope's
    own requests (round trips, `storage probe`), whichever client the pipeline reads with."""
    return obstore_gcs_client() if scheme == "gs" else obstore_client()


def client_named(name: str) -> StorageClient:
    if name not in CLIENTS:
        raise UsageError(f"--storage-client: expected one of {', '.join(CLIENTS)}, got {name!r}")
    return CLIENTS[name]()


def client_for_path(path: str, gcs_reader: str = "tf") -> str:
    """The object-store client a data set path is read with: s3:// through the reader that runs here
    (obstore, or s3fs where STALLSCOPE_S3_READER says so), anything else (gs://, or local data whose what-if asks about
    an object store) through the gs:// reader `gcs_reader` names (obstore for "pooled" where
    installed, as `tuned_for_store` falls back, else TF's own)."""
    if str(path).startswith("s3://"):
        return s3_request_plan.reader_name()
    return "obstore-gcs" if gcs_reader == "pooled" and gcs_obstore.available() else "tf-gcs"


def _as_read_by(config: PipelineConfig, client: StorageClient) -> PipelineConfig:
    """The config with the gs:// reader the client is: a what-if through TF's gs:// of a pooled config
    asks what that pipeline would do through TF's client, and the reverse."""
    if client.scheme != "gs":
        return config
    return config.replace(gcs_reader="pooled" if client.name == "obstore-gcs" else "tf")


SCENARIO_KINDS = ("object", "filesystem", "network-fs")


@dataclasses.dataclass(frozen=True)
class StorageScenario:
    """Where the data could live: a per-request latency and a shared bandwidth (inf: uncapped).
    kind "object" is read with the object-store client, "filesystem" (a local disk) with the posix
    client, "network-fs" (NFS, SMB, a FUSE mount) with the network file system's."""

    name: str
    latency_ms: float
    bandwidth_bytes_per_s: float
    kind: str = "object"
    meaning: str = ""
    block_bytes: int = 0       # the most bytes one read asks for there, where not the client's (a FUSE mount's)

    def __post_init__(self) -> None:
        if not (isinstance(self.latency_ms, (int, float)) and self.latency_ms >= 0 and math.isfinite(self.latency_ms)):
            raise UsageError(f"latency: expected a finite duration >= 0, got {self.latency_ms!r}")
        if not (isinstance(self.bandwidth_bytes_per_s, (int, float)) and self.bandwidth_bytes_per_s > 0):
            raise UsageError(f"bandwidth: expected a bandwidth above 0, got {self.bandwidth_bytes_per_s!r}")
        if self.kind not in SCENARIO_KINDS:
            raise UsageError(f"kind: expected one of {', '.join(SCENARIO_KINDS)}, got {self.kind!r}")

    @property
    def label(self) -> str:
        figures = f"{format_latency(self.latency_ms)},{format_bandwidth(self.bandwidth_bytes_per_s)}"
        return figures if self.name == figures else f"{self.name} ({figures})"


PRESETS = {
    "local-nvme": StorageScenario(
        "local-nvme", 0.1, 2e9, "filesystem",
        "a local NVMe SSD: ~0.1 ms per random read, ~2 GB/s"),
    "network-fs": StorageScenario(
        "network-fs", 2.0, 125e6, "network-fs",
        "a network file system in the same zone (NFS, EFS, Filestore): ~1-3 ms per operation, 1 Gbit/s; "
        "network-fs:LATENCY[:BANDWIDTH] sets its figures (network-fs:10ms, network-fs:20ms:10Gbit)"),
    "object-store-region": StorageScenario(
        "object-store-region", 20.0, 250e6, "object",
        "GCS or S3 in the same region: tens of ms to the first byte of a small GET, 2 Gbit/s to one VM"),
    "object-store-cross-region": StorageScenario(
        "object-store-cross-region", 100.0, 62.5e6, "object",
        "an object store in another region or continent: ~100 ms round trips, 500 Mbit/s"),
}

_LATENCY_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}
_BANDWIDTH_UNITS = {  # bytes per second
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
    "b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "kib/s": 1024, "mib/s": MIB, "gib/s": 1024**3,
}
_NUMBER = r"\s*([0-9]+(?:\.[0-9]+)?)\s*"
SPEC_HELP = ("LATENCY,BANDWIDTH pairs such as 10ms,200Mbit (latency in us/ms/s; bandwidth in bit, Kbit, "
             "Mbit, Gbit or B/s, MB/s, MiB/s, GB/s, or 'unlimited') or presets: " + ", ".join(PRESETS)
             + ", each with :LATENCY[:BANDWIDTH] to set its figures (network-fs:10ms)")


def parse_latency_ms(text: str) -> float:
    match = re.fullmatch(_NUMBER + r"([a-zA-Z]+)\s*", text)
    unit = match.group(2).lower() if match else None
    if unit not in _LATENCY_UNITS:
        raise ValueError(f"a latency such as 10ms, 500us or 0.1s, got {text.strip()!r}")
    return float(match.group(1)) * _LATENCY_UNITS[unit]


def parse_bandwidth(text: str) -> float:
    """Bytes per second from 200Mbit, 1Gbit, 25MB/s, 100MiB/s or 'unlimited' (inf)."""
    if text.strip().lower() in ("unlimited", "inf"):
        return math.inf
    match = re.fullmatch(_NUMBER + r"([a-zA-Z]+(?:/s)?)\s*", text)
    unit = match.group(2).lower() if match else None
    if unit is not None and unit.endswith("ps"):
        unit = unit[:-2] + "/s" if unit[:-2] + "/s" in _BANDWIDTH_UNITS else unit
    if unit not in _BANDWIDTH_UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"a bandwidth above 0 such as 200Mbit, 1Gbit or 100MB/s, got {text.strip()!r}")
    return float(match.group(1)) * _BANDWIDTH_UNITS[unit]


def parse_scenarios(text: str) -> tuple[StorageScenario, ...]:
    """`10ms,200Mbit`, `10ms,200Mbit,30ms,1Gbit`, `object-store-region` or a mix: comma-separated
    preset names and LATENCY,BANDWIDTH pairs. ValueError says what was expected."""
    tokens = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in tokens):
        raise ValueError(f"{SPEC_HELP}; got {text!r}")
    scenarios = []
    i = 0
    while i < len(tokens):
        if ":" in tokens[i] and tokens[i].split(":", 1)[0].lower() in PRESETS:
            scenarios.append(preset_with_figures(tokens[i]))
            i += 1
            continue
        if tokens[i].lower() in PRESETS:
            scenarios.append(PRESETS[tokens[i].lower()])
            i += 1
            continue
        try:
            latency = parse_latency_ms(tokens[i])
        except ValueError:
            raise ValueError(f"a preset ({', '.join(PRESETS)}) or a LATENCY,BANDWIDTH pair such as 10ms,200Mbit, "
                             f"got {tokens[i]!r}") from None
        if i + 1 >= len(tokens):
            raise ValueError(f"a bandwidth after the latency {tokens[i]!r} (e.g. {tokens[i]},200Mbit), got {text!r}")
        bandwidth = parse_bandwidth(tokens[i + 1])
        scenarios.append(StorageScenario(f"{format_latency(latency)},{format_bandwidth(bandwidth)}", latency,
                                         bandwidth, "object", "as given"))
        i += 2
    return tuple(scenarios)


def preset_with_figures(text: str) -> StorageScenario:
    """`network-fs:10ms` or `network-fs:10ms:10Gbit`: a preset's kind of storage at the latency (and
    bandwidth) given. ValueError says what was expected."""
    name, *figures = [part.strip() for part in text.split(":")]
    preset = PRESETS[name.lower()]
    if not 1 <= len(figures) <= 2 or not figures[0]:
        raise ValueError(f"{name}:LATENCY or {name}:LATENCY:BANDWIDTH such as {name}:10ms or {name}:10ms:1Gbit, "
                         f"got {text!r}")
    latency = parse_latency_ms(figures[0])
    bandwidth = parse_bandwidth(figures[1]) if len(figures) == 2 else preset.bandwidth_bytes_per_s
    return StorageScenario(f"{preset.name} {format_latency(latency)},{format_bandwidth(bandwidth)}", latency, bandwidth,
                           preset.kind, f"{preset.meaning.split(':')[0]}, at the figures given")


# The "as read" scenario: requests this small take about the store's latency (75 KB at 1 Gbit/s: 0.6 ms
# of transfer); the fastest tenth of them; at least this many.
AS_READ_MOST_BYTES = 256 * 1024
AS_READ_SHARE = 0.1
AS_READ_MIN_REQUESTS = 20


def as_read_scenario(round_trips: RequestTally | None, client: StorageClient, *,
                     bandwidth_bytes_per_s: float | None = None) -> StorageScenario | None:
    """The store the data is in, as read: its latency per request is the fastest tenth of the times of
    small requests asked one at a time (`round_trips.time_round_trips`), less the client's own overhead
    per request. Not the pipeline's own requests: on the emulator with 64 in flight beside a decode on
    2 cores, even their fastest tenth took 6.3 ms at 3 ms and 13.2 at 10 (median 11.0 and 18.8), where
    one-byte GETs one at a time after the probe gave 3.3 and 10.2. `bandwidth_bytes_per_s`: measured
    on shards' blocks (`round_trips.time_transfer`); None leaves it unlimited (a JPEG tree's objects
    are too small to measure it). None with too few small requests."""
    if round_trips is None:
        return None
    small = sum(1 for _, size in round_trips.samples if size <= AS_READ_MOST_BYTES)
    fastest = round_trips.percentile_ms(AS_READ_SHARE, most_bytes=AS_READ_MOST_BYTES)
    if fastest is None or small < AS_READ_MIN_REQUESTS:
        return None
    latency = round(max(0.0, fastest - client.request_overhead_ms), 1)
    measured = bandwidth_bytes_per_s is not None and bandwidth_bytes_per_s > 0
    return StorageScenario(
        "as read", latency, float(f"{bandwidth_bytes_per_s:.3g}") if measured else math.inf, "object",
        f"the store the data is in, as read: the fastest tenth of {small} small GETs, one at a time, took "
        f"{fastest:.1f} ms, less {client.request_overhead_ms:g} ms of the client's own per request; "
        + (f"ranged GETs of 4 MiB blocks, 8 at once, moved {bandwidth_bytes_per_s * 8 / 1e6:,.0f} Mbit/s"
           if measured else "bandwidth not measured (objects too small)"))


def as_read_file_system(open_and_read_ms: float | None, files: int, label: str,
                        fstype: str | None = None) -> StorageScenario | None:
    """The network file system the data is on, as read: a file's open and first read, timed one file
    at a time (`storage.under.time_file_round_trips`, the fastest tenth), are two round trips of the
    network file system's client, less its own overhead for each; a FUSE mount (`fstype` "fuse...")
    reads in FUSE_BLOCK requests. Bandwidth is not measured (a file tree's reads are too small for
    their time to be transfer). None without a timing."""
    if open_and_read_ms is None or files < 1:
        return None
    client = network_fs_client()
    trips = client.requests_per_open + 1  # the open, then the first read
    latency = round(max(0.0, open_and_read_ms / trips - client.request_overhead_ms), 2)
    fuse = (fstype or "").startswith("fuse")
    return StorageScenario(
        "as read", latency, math.inf, "network-fs",
        f"the {label} the data is on, as read: the fastest tenth of {files} files opened and read one at a "
        f"time took {open_and_read_ms:.1f} ms for an open and a read ({trips} round trips); bandwidth not measured"
        + ("; reads of at most 128 KiB, FUSE's default" if fuse else ""),
        block_bytes=FUSE_BLOCK if fuse else 0)


def scenario_client(scenario: StorageScenario, object_client: str) -> StorageClient:
    """The client a scenario is read with: its kind's (a file system's), else the object store's named,
    reading in the scenario's own block where it has one."""
    client = client_named(SCENARIO_CLIENTS.get(scenario.kind, object_client))
    return dataclasses.replace(client, block_bytes=scenario.block_bytes) if scenario.block_bytes else client


def format_latency(ms: float) -> str:
    return f"{ms * 1000:g}us" if 0 < ms < 0.1 else f"{ms:g}ms"


def format_bandwidth(bytes_per_s: float) -> str:
    if math.isinf(bytes_per_s):
        return "unlimited"
    bits = bytes_per_s * 8
    return f"{bits / 1e9:g}Gbit" if bits >= 1e9 else f"{bits / 1e6:g}Mbit"


@dataclasses.dataclass(frozen=True)
class IoPattern:
    """What one image costs to fetch: objects opened and bytes, per image (per pass over the data).
    requests_per_image / connections_per_image: measured on a real store (StorageCounters), or None
    to model them from the client."""

    format: str
    bytes_per_image: float
    objects_per_image: float
    requests_per_image: float | None = None
    connections_per_image: float | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise UsageError(f"format: expected one of {', '.join(FORMATS)}, got {self.format!r}")
        if not (self.bytes_per_image >= 0 and math.isfinite(self.bytes_per_image)):
            raise UsageError(f"bytes_per_image: expected a finite number >= 0, got {self.bytes_per_image!r}")
        if not (0 < self.objects_per_image <= 1):
            raise UsageError(f"objects_per_image: expected a number in (0, 1], got {self.objects_per_image!r}")

    @property
    def measured(self) -> bool:
        return self.requests_per_image is not None

    def requests(self, client: StorageClient) -> float:
        """r: requests per image, measured or from objects x requests per object."""
        if self.requests_per_image is not None:
            return self.requests_per_image
        object_bytes = self.bytes_per_image / self.objects_per_image
        if self.format == "records":
            return self.objects_per_image * client.requests_per_streamed_object(object_bytes)
        return self.objects_per_image * client.requests_per_object(object_bytes)

    def connections(self, client: StorageClient, in_flight: float = 1.0, images: float = math.inf) -> float:
        """Connections opened per image: one per request without reuse; with reuse, a pool of about
        `in_flight` connections opened once over `images` images (0 on a long run)."""
        if self.connections_per_image is not None:
            return self.connections_per_image
        if client.new_connection_per_request:
            return self.requests(client)
        return math.ceil(in_flight) / images if math.isfinite(images) and images > 0 else 0.0


def pattern_for(source_format: str, *, examples: int, total_bytes: int, files: int) -> IoPattern:
    """The I/O pattern of a data set as it is stored (files: one object per image; records: shards)."""
    if examples <= 0:
        raise UsageError(f"examples: expected a positive integer, got {examples!r}")
    per_image = total_bytes / examples
    if source_format == "files":
        return IoPattern("files", per_image, 1.0)
    return IoPattern("records", per_image, min(1.0, max(1, files) / examples))


def converted(pattern: IoPattern, *, examples: int, shard_bytes: int = DEFAULT_SHARD_BYTES) -> IoPattern:
    """The same images in the other format: files -> records as `stallscope convert` shards them
    (shard_bytes each, at most the data set), records -> one file per image."""
    if pattern.format == "records":
        per_image = max(1.0, pattern.bytes_per_image - RECORD_FRAMING_BYTES)
        return IoPattern("files", per_image, 1.0)
    per_image = pattern.bytes_per_image + RECORD_FRAMING_BYTES
    images_per_shard = min(examples, max(1, math.ceil(shard_bytes / per_image))) if examples > 0 else 1
    return IoPattern("records", per_image, 1.0 / images_per_shard)


@dataclasses.dataclass(frozen=True)
class Reads:
    """How a pipeline issues reads: parallel calls of the stage that reads (None: one at a time),
    the threads they run on, and whether that stage's threads also decode (files read inside the
    decode map) or only read (a separate read map, a parallel interleave over shards)."""

    parallel_calls: int | None
    pool_threads: int
    reads_in_decode_map: bool
    private_pool: bool
    grouped: bool = False  # requests in groups (stallscope's s3:// reader), each holding a pool thread while it waits

    def describe(self) -> str:
        if self.parallel_calls is None:
            return "one read at a time"
        pool = f"a private pool of {self.pool_threads}" if self.private_pool else \
            f"tf.data's shared pool ({self.pool_threads} threads = cores)"
        if self.grouped:
            group = min(self.parallel_calls, s3_request_plan.GROUP_REQUESTS)
            return f"{self.parallel_calls} requests in flight, in groups of {group} that each hold a thread of {pool}"
        calls = "autotune" if self.parallel_calls == AUTOTUNE else str(self.parallel_calls)
        return f"{calls} parallel reads on {pool}"


def reads_of(config: PipelineConfig, source_format: str, cores: int) -> Reads:
    """The read stage of a config, as the builder lays it out (see pipeline/builder.py)."""
    pool = config.private_threadpool_size or max(1, int(cores))
    if source_format == "files":
        calls = config.read_parallelism if config.read_parallelism is not None else config.map_parallelism
        in_map = config.read_parallelism is None or config.read_parallelism == config.map_parallelism
    else:
        calls = config.read_parallelism
        in_map = False
    return Reads(parallel_calls=calls, pool_threads=pool, reads_in_decode_map=in_map,
                 private_pool=bool(config.private_threadpool_size))


def autotuned_reads(source_format: str, cores: int) -> Reads:
    """What `read_parallelism=autotune` on tf.data's shared pool gives (the usual first fix)."""
    return Reads(parallel_calls=AUTOTUNE, pool_threads=max(1, int(cores)), reads_in_decode_map=source_format == "files",
                 private_pool=False)


# Share of the shorter of a records stream's wait and the chain's own work per image that the kernel's
# read-ahead hides on a network file system (it fetches the next window while the reader's chain decodes).
# Measured through the emulator's FUSE mount, the records read by one stream alone and then with a decode
# in the chain: 0.77 of the wait hidden at 2 ms, 0.42 of the decode at 10 ms, 0.5 of the wait for the
# seeds' pipeline at 2 ms (`diagnose`'s pipeline-alone probe against its records-alone probe).
READ_AHEAD_HIDES = 0.5


@dataclasses.dataclass(frozen=True)
class Costs:
    """Per-image costs (ms) of one format on one store through one client."""

    requests: float          # r
    wait_ms: float           # (r + k h) L + r s less s's CPU part: time a reader waits on requests
    transfer_ms: float       # b / B (inf bandwidth: 0)
    cpu_ms: float            # d: decode + the client's transfer and request CPU (+ a co-located server's)
    client_cpu_ms: float     # the part of d the reading itself costs (what a read-only thread holds)
    bytes: float
    local_chain_ms: float | None = None  # the pipeline's own time per image in one chain, where measured
    # A stream through a network file system: the kernel reads the next window ahead while the reader's
    # chain works on the bytes it has, and the images behind one reader are not decoded in parallel
    # (`behind_one_reader_rate`). read_ahead_hidden_ms: what that hides of one chain's time per image
    # (READ_AHEAD_HIDES), 0 where the chain was measured on that storage (the measure has it in).
    read_ahead: bool = False
    read_ahead_hidden_ms: float = 0.0

    @property
    def own_ms(self) -> float:
        """The pipeline's own time per image in one chain: its measured local pace where known (threads
        of TF's own that run beside the chain make its CPU per image an overestimate); else all of its
        CPU that is not the reading."""
        own = self.cpu_ms - self.client_cpu_ms
        if self.local_chain_ms is not None:
            own = min(own, self.local_chain_ms)
        return own

    @property
    def sequential_ms(self) -> float:
        """One image's time when reads wait in the chain: the store's part, then the pipeline's own,
        less what the kernel's read-ahead hides of them on a network file system."""
        return self.wait_ms + self.transfer_ms + self.client_cpu_ms + self.own_ms - self.read_ahead_hidden_ms


def costs(pattern: IoPattern, scenario: StorageScenario, client: StorageClient, *, cpu_ms_per_image: float,
          request_overhead_ms: float | None = None, server_cpu_ms_per_request: float = 0.0,
          local_chain_ms: float | None = None, read_chain: tuple[float, float] | None = None,
          server_cpu_ms_per_image: float = 0.0) -> Costs:
    """r, (r + kh)L + rs, b/B and d for one image. request_overhead_ms: s measured at 0 ms (None: the
    client's default). server_cpu_ms_per_request: CPU a store on this same host takes per request
    (an emulator in a test; 0 for a real store), the part of s a remote store spends on its own
    machine. local_chain_ms: the pipeline's measured local time per image (None: unknown; the
    sequential chain is then all of d). read_chain: (wall, CPU) ms per image of the records read alone
    where they are, measured (`probes.probe_record_reads`): the reader's wait and CPU as they are,
    in place of the requests' model, with d the measured CPU, which has the reading in it.
    server_cpu_ms_per_image: CPU a FUSE mount's daemon on this host took per image, measured
    (`fuse_daemons`): still in each request's time (a request waits for it), and now in d too, the
    cores' work that caps how many reads in flight can help."""
    whatif._require_non_negative("cpu_ms_per_image", cpu_ms_per_image)
    s = client.request_overhead_ms if request_overhead_ms is None else request_overhead_ms
    whatif._require_non_negative("request_overhead_ms", s)
    r = pattern.requests(client)
    read_ahead = client.scheme == NETWORK_FS and pattern.format == "records"
    if read_chain is not None:
        wall, cpu = read_chain
        # the measured chain had these reads in it: the pipeline's own part is what is left of it
        own_chain = local_chain_ms - wall if local_chain_ms is not None and local_chain_ms > wall else None
        c = Costs(requests=r, wait_ms=max(0.0, wall - cpu), transfer_ms=0.0,
                  cpu_ms=max(cpu_ms_per_image, cpu) + server_cpu_ms_per_image, client_cpu_ms=cpu,
                  bytes=pattern.bytes_per_image, local_chain_ms=own_chain, read_ahead=read_ahead)
        return c if own_chain is not None else _with_read_ahead(c)
    round_trips = r + pattern.connections(client) * client.handshake_round_trips
    transfer = 0.0 if math.isinf(scenario.bandwidth_bytes_per_s) else \
        pattern.bytes_per_image * 1000.0 / scenario.bandwidth_bytes_per_s
    streamed = pattern.format == "records"  # read in pieces: each request's buffer is a whole block
    buffer = client.block_buffer_cpu_ms_per_mib * client.block_bytes / MIB if streamed else 0.0
    reading = (pattern.bytes_per_image / MIB * client.transfer_cpu_ms_per_mib
               + r * (client.request_cpu_ms + buffer + server_cpu_ms_per_request))
    # s's CPU part is in d, where the cores cap it. The rest is the store's own time per request, which
    # a store on this host spends on these cores: its CPU (in d) replaces that much of the wait.
    waiting = max(0.0, s - client.request_cpu_ms - server_cpu_ms_per_request)
    return _with_read_ahead(Costs(
        requests=r, wait_ms=round_trips * scenario.latency_ms + r * waiting, transfer_ms=transfer,
        cpu_ms=cpu_ms_per_image + reading + server_cpu_ms_per_image, client_cpu_ms=reading,
        bytes=pattern.bytes_per_image, local_chain_ms=local_chain_ms, read_ahead=read_ahead))


def _with_read_ahead(c: Costs) -> Costs:
    """`c` with what the kernel's read-ahead hides of one chain: READ_AHEAD_HIDES of the shorter of its
    wait and its own work per image, on a network file system's stream only."""
    if not c.read_ahead:
        return c
    hidden = READ_AHEAD_HIDES * min(c.wait_ms + c.transfer_ms, c.own_ms)
    return dataclasses.replace(c, read_ahead_hidden_ms=hidden)


def sequential_rate(c: Costs) -> float:
    """Images/s reading one request at a time in the same chain as the decode: 1 / ((r + kh)L + rs + b/B + d),
    with d's own part no more than the pipeline's measured local time per image."""
    total = c.sequential_ms
    return 1000.0 / total if total > 0 else math.inf


def resolved_calls(reads: Reads) -> int:
    """Parallel calls as they run: autotune goes up to the pool's threads; None is one."""
    if reads.parallel_calls is None:
        return 1
    return reads.pool_threads if reads.parallel_calls == AUTOTUNE else reads.parallel_calls


def requests_in_flight(reads: Reads, c: Costs) -> float:
    """C: parallel calls, at most the pool's threads, each holding a request only while it is not
    decoding: the pool's threads run the decode map too, even where the read is a stage of its own
    (measured here, benchmarks/storage.py: 16 reads on a 2-thread shared pool keep ~1.4 in flight
    at 10 ms, as T w / (w + d) says), so a thread waits on storage w / (w + d) of its time."""
    if reads.parallel_calls is None:
        return 1.0
    calls = resolved_calls(reads)
    busy = c.wait_ms + c.transfer_ms
    if reads.grouped:
        # A group of g waits on the store once, holding one pool thread (the client's own threads do the
        # requests' CPU), then its g images are decoded on the same pool: g requests in flight for
        # busy / (busy + g x decode) of each thread's time, up to the groups' own capacity (the next group is
        # fetched while one is consumed). benchmarks/storage.py --store s3, `diagnose --fix`'s files config
        # on tf.data's 2 shared threads: 1,176 images/s at 10 ms and 683 at 30 ms, where 16 in flight
        # would give 1,600 and 533.
        group = min(calls, s3_request_plan.GROUP_REQUESTS)
        capacity = s3_request_plan.groups_in_flight(calls) * group
        decode = group * (c.cpu_ms - c.client_cpu_ms)
        share = busy / (busy + decode) if busy + decode > 0 else 1.0
        return max(1.0, min(float(capacity), reads.pool_threads * group * share))
    # Below one where the pool's threads spend most of their time decoding: then each image holds a
    # thread for its wait and its decode in turn, T / (w + d) images/s (`diagnose --fix`'s files config
    # on one shared thread, store on its own core, at 0 and 3 ms: predicted/measured 1.30x and 1.33x
    # with C held at 1, 1.16x and 1.12x so; benchmarks/storage.py --store-cores 1).
    held = c.cpu_ms
    share = busy / (busy + held) if busy + held > 0 else 1.0
    return min(float(calls), reads.pool_threads * share)


STORAGE_BOUNDS = ("requests", "bandwidth", "client")  # limits that are the store's or its client's


def _cpu_bound(c: Costs) -> str:
    """"client" when reading (the client's CPU) costs more of the CPU than the rest (decode), else "cpu"."""
    return "client" if c.client_cpu_ms > c.cpu_ms - c.client_cpu_ms else "cpu"


def parallel_rate(c: Costs, in_flight: float, cores: float) -> tuple[float, str]:
    """min(C / ((r + kh)L + rs), cores / d, B / b) images/s, and which term limits it: "requests",
    "bandwidth", or the CPU: "client" (mostly the storage client's work) or "cpu" (mostly decoding)."""
    whatif._require_positive("cores", cores)
    terms = {
        "requests": in_flight * 1000.0 / c.wait_ms if c.wait_ms > 0 else math.inf,
        "cpu": cores * 1000.0 / c.cpu_ms if c.cpu_ms > 0 else math.inf,
        "bandwidth": 1000.0 / c.transfer_ms if c.transfer_ms > 0 else math.inf,
    }
    bound = min(terms, key=terms.get)
    return terms[bound], _cpu_bound(c) if bound == "cpu" else bound


def sequential_bound(c: Costs) -> str:
    """The largest part of a sequential image's time (the same names as `parallel_rate`)."""
    parts = {"requests": c.wait_ms, "bandwidth": c.transfer_ms, "client": c.client_cpu_ms,
             "cpu": c.cpu_ms - c.client_cpu_ms}
    return max(parts, key=parts.get)


# TFRecordDataset's read buffer (buffer_size=None): a reader of records waits once per fill at least.
RECORD_READ_BUFFER_BYTES = 256 << 10


def decode_calls(config: PipelineConfig, workload: Workload) -> int:
    """The decode map's parallel calls as they run: autotune up to its pool's threads; None is one."""
    if config.map_parallelism is None:
        return 1
    if config.map_parallelism == AUTOTUNE:
        return config.private_threadpool_size or workload.shared_pool_threads
    return max(1, config.map_parallelism)


def behind_one_reader_rate(c: Costs, calls: int, cores: float) -> tuple[float, float]:
    """(images/s, the cores' own rate) of shards read one at a time by a single stream with the decode
    in a parallel map of `calls`. A request brings 1/r images at once; the map takes at most `calls` of
    them while the reader waits on the next request, so the rest are decoded while the reader stands
    still: each image costs the chain's time plus that share of its decode on the cores. (benchmarks/
    advice.py, records on the emulated gs:// at 10 ms, a request per 4.7 MB shard: seed 436 images/s,
    the decode in parallel 546, where the chain and the cores apart predicted 776.) On a network file
    system (`Costs.read_ahead`) the images behind the reader are decoded as if by one thread, whatever
    the calls: the seeds' records on the emulator's 2 ms mount, seed 532 images/s, the decode in
    parallel 740 (dividing by the calls predicted 920); a bare decode map, sequential or in parallel,
    816-822 images/s at 2 ms and 237-240 at 10 ms."""
    chain = c.wait_ms + c.transfer_ms + c.client_cpu_ms
    own = c.own_ms
    threads = 1.0 if c.read_ahead else max(1.0, min(float(calls), cores))
    # the reader waits once per request, or per buffer it fills where requests are smaller (a mount's)
    per_wait = max(RECORD_READ_BUFFER_BYTES / c.bytes if c.bytes > 0 else 1.0,
                   1.0 / c.requests if c.requests > 0 else 1.0)
    behind = max(0.0, 1.0 - calls / per_wait)
    decode = cores * 1000.0 / c.cpu_ms if c.cpu_ms > 0 else math.inf
    per_image = chain + behind * own / threads
    return min(1000.0 / per_image if per_image > 0 else math.inf, decode), decode


def refills_from_storage(config: PipelineConfig, source_format: str, examples: int, client: StorageClient) -> bool:
    """Whether the pipeline's shuffle of encoded records takes in the whole epoch from storage again at
    each epoch start, as `pipeline.builder.build` lays it out: records read by TF's reader with a buffer
    that holds the data set are shuffled as one permutation an epoch, the repeat after it, and without
    TF's shuffle-and-repeat fusion (off in the seeds' pipeline) that buffer empties at each epoch end.
    Then the epoch's reads come before its first decode, and the decode's after its last read."""
    if source_format != "records" or config.shuffle_at != "encoded" or not config.shuffle_buffer:
        return False
    if client.own_reader or config.shuffle_and_repeat_fusion is not False:
        return False
    return bool(examples) and config.shuffle_buffer >= examples


def fill_ms(c: Costs, reads_in_flight: float | None, cores: float) -> float:
    """ms per image of reads with no decode beside them: one stream's part of the chain where
    `reads_in_flight` is None (less what the read-ahead hides of it: the kernel reads ahead of a reader
    with nothing else to do as well), else the least of the requests', the bandwidth's and the client's
    CPU rates."""
    if reads_in_flight is None:
        return max(0.0, c.wait_ms + c.transfer_ms + c.client_cpu_ms - c.read_ahead_hidden_ms)
    rate = min(reads_in_flight * 1000.0 / c.wait_ms if c.wait_ms > 0 else math.inf,
               1000.0 / c.transfer_ms if c.transfer_ms > 0 else math.inf,
               cores * 1000.0 / c.client_cpu_ms if c.client_cpu_ms > 0 else math.inf)
    return 1000.0 / rate if math.isfinite(rate) else 0.0


def refilled(cell: ReadPrediction, c: Costs, *, fill: float, decode_threads: float, cores: float,
             compute_ms: float, batch_size: int, overlapped: bool) -> ReadPrediction:
    """`cell` where `refills_from_storage`: each epoch reads all its records first (`fill` ms per image,
    no decode beside the reads), then decodes them on `decode_threads` while the device steps (a
    prefetch hides the decode, not the reads). Records on the emulator's 10 ms mount, 8 shards read in
    parallel, decoded in parallel, prefetched: 1,511 images/s with the shuffle after the decode, 1,013
    with it before (benchmarks/advice.py's cell; `--fix` applied both and reached 0.75x of the best by hand)."""
    decode = c.own_ms if decode_threads <= 1 else (c.cpu_ms - c.client_cpu_ms) / min(decode_threads, max(cores, 1.0))
    rate = 1000.0 / (fill + decode) if fill + decode > 0 else math.inf
    pipeline_ms = batch_size * (fill + decode)
    prediction = whatif.predict(compute_ms=compute_ms, pipeline_ms=pipeline_ms, batch_size=batch_size,
                                overlapped=overlapped, unhidden_ms=batch_size * fill)
    return dataclasses.replace(cell, images_per_second=rate, bound="requests" if fill >= decode else _cpu_bound(c),
                               prediction=prediction,
                               reads=f"{cell.reads}; the epoch's reads before its decode (a shuffle of all of it)")


def needed_in_flight(c: Costs, cores: float) -> int:
    """Reads in flight that keep the cores (or the bandwidth) busy: Little's law, the rate the
    cores or the bandwidth allow times the time a request is held (latency x throughput)."""
    cap = min(cores * 1000.0 / c.cpu_ms if c.cpu_ms > 0 else math.inf,
              1000.0 / c.transfer_ms if c.transfer_ms > 0 else math.inf)
    if math.isinf(cap) or c.wait_ms <= 0:
        return 1
    return max(1, math.ceil(cap * c.wait_ms / 1000.0 - 1e-9))


@dataclasses.dataclass(frozen=True)
class ReadPrediction:
    """One cell of the what-if table: a way of reading, its rate, and the step it gives."""

    mode: str                  # sequential, parallel, enough_in_flight
    in_flight: float           # C
    images_per_second: float
    bound: str                 # requests, bandwidth or cpu
    prediction: whatif.Prediction
    reads: str                 # how the reads are issued, in words
    private_threadpool_size: int = 0
    read_parallelism: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "in_flight": self.in_flight, "images_per_second": self.images_per_second,
                "bound": self.bound, "reads": self.reads, "private_threadpool_size": self.private_threadpool_size,
                "read_parallelism": self.read_parallelism, **self.prediction.to_dict()}


@dataclasses.dataclass(frozen=True)
class FormatWhatIf:
    """One format on one store: its per-image costs and the three ways of reading it."""

    format: str
    client: str
    basis: str                 # "measured" (requests from a real store's counters) or "modelled"
    requests_per_image: float
    connections_per_image: float
    bytes_per_image: float
    costs: Costs
    sequential: ReadPrediction
    parallel: ReadPrediction
    enough_in_flight: ReadPrediction
    objects_per_image: float = 1.0  # shards per image for records: what a smaller block changes
    sequential_reads: ReadPrediction | None = None  # records read in turn, decoded in a parallel map

    @property
    def cells(self) -> tuple[ReadPrediction, ...]:
        return (self.sequential, self.parallel, self.enough_in_flight)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "client": self.client, "basis": self.basis,
                "requests_per_image": self.requests_per_image, "connections_per_image": self.connections_per_image,
                "bytes_per_image": self.bytes_per_image, "costs": dataclasses.asdict(self.costs),
                **{cell.mode: cell.to_dict() for cell in self.cells}}


@dataclasses.dataclass(frozen=True)
class ScenarioWhatIf:
    scenario: StorageScenario
    named: bool                # the user named it (advice considers it) rather than a preset shown by default
    formats: tuple[FormatWhatIf, ...]

    def format(self, name: str) -> FormatWhatIf:
        return next(f for f in self.formats if f.format == name)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": dataclasses.asdict(self.scenario), "named": self.named,
                "formats": [f.to_dict() for f in self.formats]}


@dataclasses.dataclass(frozen=True)
class Workload:
    """The measured figures the what-if starts from (all from the diagnosis' probes)."""

    cpu_ms_per_image: float    # the pipeline's CPU per image (warm probe, all threads)
    cores: float               # cores the pipeline can use here
    compute_ms: float          # the device's step (compute probe)
    batch_size: int
    overlapped: bool           # the pipeline as written overlaps the step (prefetch)
    examples: int
    machine_cores: int | None = None  # cores the machine has: tf.data's shared pool size (None: cores)
    # The pipeline's local time per image once running (the warm probe after its first batch): what
    # one chain of reads and decodes costs before the store adds to it. None: not measured.
    chain_ms_per_image: float | None = None
    # The data set's records read by one stream alone where they are (probes.ReadChain): wall and CPU
    # ms per image. None: not measured (files, local disk, or a store the data is not on).
    read_chain_ms_per_image: float | None = None
    read_chain_cpu_ms_per_image: float | None = None
    # CPU per image of the FUSE daemon serving the mount the data is on, on these cores (`fuse_daemons`),
    # measured during the pipeline-alone probe; 0 elsewhere. It applies to the storage as read only.
    server_cpu_ms_per_image: float = 0.0

    @property
    def read_chain(self) -> tuple[float, float] | None:
        """(wall, CPU) ms per image of the records read alone, where measured."""
        if self.read_chain_ms_per_image is None:
            return None
        return self.read_chain_ms_per_image, self.read_chain_cpu_ms_per_image or 0.0

    @property
    def shared_pool_threads(self) -> int:
        return max(1, int(self.machine_cores if self.machine_cores else round(self.cores)))


def sustained_cpu_ms(workload: Workload) -> float:
    """d: the pipeline's CPU per image, no more than the cores x its measured local time per image.
    A parallel pipeline that ran locally at 1,000 images/s on 2 cores needs at most 2 ms of core time
    per image, whatever its process CPU says (TF's idle threads spin; measured, benchmarks/storage.py:
    tuned records on the tiny set predicted at 0.64-0.72x of measured at 0 ms from process CPU)."""
    if workload.chain_ms_per_image is None:
        return workload.cpu_ms_per_image
    return min(workload.cpu_ms_per_image, workload.cores * workload.chain_ms_per_image)


def predict_format(pattern: IoPattern, scenario: StorageScenario, client: StorageClient, config: PipelineConfig,
                   workload: Workload, *, request_overhead_ms: float | None = None,
                   server_cpu_ms_per_request: float = 0.0,
                   read_chain: tuple[float, float] | None = None, as_read: bool = False) -> FormatWhatIf:
    """The three ways of reading one format: sequential, the config's parallel reads (autotune on
    the shared pool when it reads one at a time), and enough reads in flight on a private pool.
    read_chain: the format's reads alone, measured where the data is (`costs`); as_read: the scenario
    is the storage the data is on, whose daemon's CPU on these cores was measured."""
    c = costs(pattern, scenario, client, cpu_ms_per_image=sustained_cpu_ms(workload),
              request_overhead_ms=request_overhead_ms, server_cpu_ms_per_request=server_cpu_ms_per_request,
              local_chain_ms=workload.chain_ms_per_image, read_chain=read_chain,
              server_cpu_ms_per_image=workload.server_cpu_ms_per_image if as_read else 0.0)
    cores = workload.cores

    def step(rate: float, overlapped: bool) -> whatif.Prediction:
        pipeline_ms = workload.batch_size * 1000.0 / rate if rate > 0 and math.isfinite(rate) else 0.0
        return whatif.predict(compute_ms=workload.compute_ms, pipeline_ms=pipeline_ms,
                              batch_size=workload.batch_size, overlapped=overlapped)

    seq_rate = sequential_rate(c)
    sequential = ReadPrediction("sequential", 1.0, seq_rate, sequential_bound(c), step(seq_rate, workload.overlapped),
                                "one read at a time")
    apart_rate, decode = behind_one_reader_rate(c, decode_calls(config, workload), cores)
    apart = ReadPrediction("sequential_reads", 1.0, apart_rate,
                           "requests" if apart_rate < decode else _cpu_bound(c), step(apart_rate, True),
                           "one read at a time, the decode in a parallel map")
    round_trip = scenario.latency_ms * (client.requests_per_open + 1) if client.scheme == NETWORK_FS else None
    reads = reads_of(tuned_for_store(_as_read_by(config, client), pattern.format, client.scheme,
                                     round_trip_ms=round_trip), pattern.format, workload.shared_pool_threads)
    if reads.parallel_calls is None:
        reads = autotuned_reads(pattern.format, workload.shared_pool_threads)
    grouped = client.grouped_reads and pattern.format == "files"  # stallscope's s3:// reader
    if grouped:  # groups of requests, as many as the read's parallel calls, on the config's pool
        reads = dataclasses.replace(reads, parallel_calls=s3_request_plan.in_flight(reads.parallel_calls),
                                    reads_in_decode_map=False, grouped=True)
    shards = max(1, round(workload.examples * pattern.objects_per_image))
    if pattern.format == "records" and resolved_calls(reads) > shards:  # an interleave reads at most every shard
        reads = dataclasses.replace(reads, parallel_calls=shards)
    c_now = requests_in_flight(reads, c)
    par_rate, par_bound = parallel_rate(c, c_now, cores)
    parallel = ReadPrediction("parallel", c_now, par_rate, par_bound, step(par_rate, True), reads.describe(),
                              reads.pool_threads if reads.private_pool else 0, reads.parallel_calls)
    need = needed_in_flight(c, cores)
    if pattern.format == "records":  # each shard is read one request at a time
        need = min(need, shards)
    pool = need + max(1, math.ceil(cores))
    enough_reads = Reads(parallel_calls=need, pool_threads=pool, reads_in_decode_map=False, private_pool=True,
                         grouped=grouped)
    c_enough = requests_in_flight(enough_reads, c)
    enough_rate, enough_bound = parallel_rate(c, c_enough, cores)
    enough = ReadPrediction("enough_in_flight", c_enough, enough_rate, enough_bound, step(enough_rate, True),
                            enough_reads.describe(), pool, need)
    if refills_from_storage(config, pattern.format, workload.examples, client):
        def refill(cell: ReadPrediction, reads_in_flight: float | None, threads: float, overlapped: bool):
            return refilled(cell, c, fill=fill_ms(c, reads_in_flight, cores), decode_threads=threads, cores=cores,
                            compute_ms=workload.compute_ms, batch_size=workload.batch_size, overlapped=overlapped)

        map_calls = float(decode_calls(config, workload))
        sequential = refill(sequential, None, 1.0, workload.overlapped)
        apart = refill(apart, None, map_calls, True)
        parallel = refill(parallel, float(resolved_calls(reads)), map_calls, True)
        enough = refill(enough, float(need), map_calls, True)
    return FormatWhatIf(
        format=pattern.format, client=client.name, basis="measured" if pattern.measured else "modelled",
        requests_per_image=c.requests, bytes_per_image=pattern.bytes_per_image,
        connections_per_image=pattern.connections(client, c_now, workload.examples),
        costs=c, sequential=sequential, parallel=parallel, enough_in_flight=enough,
        objects_per_image=pattern.objects_per_image, sequential_reads=apart)


@dataclasses.dataclass(frozen=True)
class StorageWhatIf:
    """The storage what-if of one diagnosis: per scenario, both formats, three ways of reading."""

    source_format: str
    object_client: str
    scenarios: tuple[ScenarioWhatIf, ...]
    workload: Workload
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"source_format": self.source_format, "object_client": self.object_client,
                "workload": dataclasses.asdict(self.workload), "scenarios": [s.to_dict() for s in self.scenarios],
                "notes": list(self.notes)}


def storage_whatif(pattern: IoPattern, config: PipelineConfig, workload: Workload, *,
                   scenarios: Sequence[StorageScenario] = (), object_client: str = "tf-gcs",
                   shard_bytes: int = DEFAULT_SHARD_BYTES, request_overhead_ms: float | None = None,
                   server_cpu_ms_per_request: float = 0.0, as_read: StorageScenario | None = None) -> StorageWhatIf:
    """Both formats at each scenario the user named (else the presets), after `as_read` where given (the
    store the data is in, as read during the probe; advice considers it as a named one). The measured
    format keeps measured requests where the pattern has them; the other format is modelled from the
    same bytes."""
    named = bool(scenarios)
    chosen = tuple(scenarios) or tuple(PRESETS.values())
    if as_read is not None:
        chosen = (as_read, *chosen)
    other = converted(dataclasses.replace(pattern, requests_per_image=None, connections_per_image=None),
                      examples=workload.examples, shard_bytes=shard_bytes)
    patterns = {pattern.format: pattern, other.format: other}
    rows = []
    for scenario in chosen:
        client = scenario_client(scenario, object_client)
        formats = []
        for name in FORMATS:
            p = patterns[name]
            # requests counted where the data is say nothing of another kind of storage
            if p.measured and client.name != object_client and scenario is not as_read:
                p = dataclasses.replace(p, requests_per_image=None, connections_per_image=None)
            formats.append(predict_format(p, scenario, client, config, workload,
                                          request_overhead_ms=request_overhead_ms if client.name == object_client
                                          else None, server_cpu_ms_per_request=server_cpu_ms_per_request,
                                          read_chain=workload.read_chain if scenario is as_read
                                          and name == pattern.format else None, as_read=scenario is as_read))
        rows.append(ScenarioWhatIf(scenario=scenario, named=named or scenario is as_read, formats=tuple(formats)))
    notes = []
    if request_overhead_ms is None:
        notes.append("per-request overhead is the client's default, not measured at 0 ms latency")
    return StorageWhatIf(source_format=pattern.format, object_client=object_client, scenarios=tuple(rows),
                         workload=workload, notes=tuple(notes))


def as_read_row(what: StorageWhatIf | None) -> ScenarioWhatIf | None:
    """The storage the data is on, as read during the diagnosis (None where it was not timed)."""
    if what is None:
        return None
    return next((row for row in what.scenarios if row.scenario.name == "as read"), None)


def predict_config(what: StorageWhatIf, row: ScenarioWhatIf, config: PipelineConfig) -> ReadPrediction:
    """`config` reading the data set's own format at `row`'s store: the cell a fix of the reads is
    predicted by (the same model and figures as the what-if table's row)."""
    current = row.format(what.source_format)
    measured = current.basis == "measured"
    pattern = IoPattern(current.format, current.bytes_per_image, current.objects_per_image,
                        requests_per_image=current.requests_per_image if measured else None,
                        connections_per_image=current.connections_per_image if measured else None)
    client = scenario_client(row.scenario, what.object_client)
    read_chain = what.workload.read_chain if row.scenario.name == "as read" else None
    return as_configured(predict_format(pattern, row.scenario, client, config, what.workload,
                                        read_chain=read_chain, as_read=row.scenario.name == "as read"), config)


def as_configured_mode(config: PipelineConfig, source_format: str) -> str:
    """The read mode of the config as it stands: sequential when it reads one at a time."""
    return "sequential" if reads_of(config, source_format, 1).parallel_calls is None else "parallel"


def as_configured(row: FormatWhatIf, config: PipelineConfig) -> ReadPrediction:
    """The cell that is the config as it stands: sequential when it reads one at a time (shards read in
    turn whose decode map is parallel: the reads' chain and the decode apart)."""
    if as_configured_mode(config, row.format) != "sequential":
        return row.parallel
    if row.format == "records" and config.map_parallelism is not None and row.sequential_reads is not None:
        return row.sequential_reads
    return row.sequential
