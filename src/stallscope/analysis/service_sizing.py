"""How many tf.data service workers a CPU-bound input needs, and what the link must carry.

The service moves the pipeline (read, decode, augment, batch) onto N worker machines of C cores each;
the trainer only receives finished elements (batches). Its throughput is the least of four rates, five
where the workers share the trainer's host:

- the workers: N x C cores over the CPU one element costs a worker (the pipeline's CPU, measured by
  the probes, plus serializing the element for gRPC and, with compression, snappy-compressing it);
- the link: its bandwidth over the bytes shipped per element (decoded images are large: a 224 px
  float32 image is 588 KiB, 5-30x its JPEG; snappy barely shrinks float pixels);
- the trainer's receiving: its free cores over the CPU it spends per element received (gRPC, copies);
- the device: what the model's step takes (compute alone);
- where the workers run on the trainer's own host (a local service, `stallscope serve local`), that
  host's cores: the workers' CPU and the trainer's receiving come out of the same cores.

Per-megabyte costs were measured on this project's 2-core test machine with a local service
(float32 batches of 32 x 224 x 224 x 3, benchmarks/data_service.py): worker 0.25 ms/MB to send
uncompressed, 0.9 ms/MB with TF's default compression ("AUTO", snappy); trainer 0.4 ms/MB to receive
either way; snappy's ratio on decoded float32 images 1.00. Pure arithmetic: no TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import math

from stallscope.errors import UsageError

COMPRESSIONS = ("none", "auto")   # distribute(compression=None) / compression="AUTO" (TF's default: snappy)
SEND_MS_PER_MB = 0.25             # worker CPU to serialize and send one MB of elements, uncompressed
COMPRESS_MS_PER_MB = 0.65         # worker CPU added per MB by snappy (compression="AUTO")
RECEIVE_MS_PER_MB = 0.4           # trainer CPU to receive one MB (gRPC, deserialize, copy)
DECODED_FLOAT_RATIO = 1.0         # snappy on decoded float32 images: measured 1.00 (19.27 -> 19.25 MB)
DEFAULT_LINK_GBPS = 10.0          # a common data-centre NIC; say the real one with link_gbps
MAX_WORKERS = 64                  # beyond this the figure says little
BOUNDS = ("device", "workers", "link", "receive", "host")
MB = 1e6


@dataclasses.dataclass(frozen=True)
class ServiceInputs:
    """What the sizing needs, per element the service ships (one batch where the pipeline batches).

    cpu_ms_per_element: the pipeline's CPU per element (all threads), as the probes measured it here;
    bytes_per_element: the element's bytes as tensors (None: not known; link and receiving unmodelled);
    device_elements_per_second: the step's pace with input free (compute alone);
    worker_cores: the cores of each worker; trainer_cores: the trainer's cores free to receive;
    link_gbps: the network between workers and trainer; compression: "none" or "auto" (TF's snappy);
    compression_ratio: raw over compressed bytes under snappy; images_per_element: the batch size;
    local_elements_per_second: the trainer alone now (the pipeline on its own cores), for the crossover;
    link_given, worker_cores_given: the user said the link and the workers' cores (else they are assumed);
    host_cores: where the workers share the trainer's host, the cores that host gives the workers and the
    trainer's receiving together (None: the workers are on hosts of their own)."""

    cpu_ms_per_element: float
    bytes_per_element: float | None
    device_elements_per_second: float
    worker_cores: float = 1.0
    trainer_cores: float = 1.0
    link_gbps: float = DEFAULT_LINK_GBPS
    compression: str = "none"
    compression_ratio: float = DECODED_FLOAT_RATIO
    images_per_element: int = 1
    local_elements_per_second: float | None = None
    link_given: bool = False
    worker_cores_given: bool = False
    host_cores: float | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_ms_per_element", "device_elements_per_second", "worker_cores", "trainer_cores",
                     "link_gbps", "compression_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise UsageError(f"{name}: expected a number above 0, got {value!r}")
        if self.bytes_per_element is not None and not self.bytes_per_element > 0:
            raise UsageError(f"bytes_per_element: expected a number above 0 or None, got {self.bytes_per_element!r}")
        if self.host_cores is not None and (isinstance(self.host_cores, bool)
                                            or not isinstance(self.host_cores, (int, float))
                                            or not 0 < self.host_cores < math.inf):
            raise UsageError(f"host_cores: expected a number above 0 or None, got {self.host_cores!r}")
        if self.compression not in COMPRESSIONS:
            raise UsageError(f"compression: expected one of {', '.join(COMPRESSIONS)}, got {self.compression!r}")
        if isinstance(self.images_per_element, bool) or not isinstance(self.images_per_element, int) \
                or self.images_per_element < 1:
            raise UsageError(f"images_per_element: expected an integer >= 1, got {self.images_per_element!r}")


@dataclasses.dataclass(frozen=True)
class ServiceAssumptions:
    """The service's hardware, which no probe here can measure: the link to the trainer (Gbit/s) and each
    worker's cores. None: assumed (a 10 Gbit/s link; workers with this host's free cores)."""

    link_gbps: float | None = None
    worker_cores: float | None = None

    def __post_init__(self) -> None:
        for name in ("link_gbps", "worker_cores"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < math.inf):
                raise UsageError(f"{name}: expected a number above 0 or None, got {value!r}")

    @classmethod
    def given(cls, link: str | None = None, worker_cores: float | None = None) -> "ServiceAssumptions":
        """From the API's words: `link` as a bandwidth ("10Gbit/s"), `worker_cores` a number of cores."""
        if link is not None and not isinstance(link, str):
            raise UsageError(f"service_link: expected a bandwidth such as '10Gbit/s', got {link!r}")
        try:
            gbps = None if link is None else parse_link_gbps(link)
        except ValueError as exc:
            raise UsageError(f"service_link: expected {exc}") from None
        if worker_cores is not None and (isinstance(worker_cores, bool) or not isinstance(worker_cores, (int, float))
                                         or not 0 < worker_cores < math.inf):
            raise UsageError(f"service_worker_cores: expected a number of cores above 0, got {worker_cores!r}")
        return cls(link_gbps=gbps, worker_cores=None if worker_cores is None else float(worker_cores))

    def apply(self, inputs: "ServiceInputs") -> "ServiceInputs":
        """The inputs with what was given in place of what was assumed, marked as given."""
        changes: dict = {}
        if self.link_gbps is not None:
            changes.update(link_gbps=self.link_gbps, link_given=True)
        if self.worker_cores is not None:
            changes.update(worker_cores=self.worker_cores, worker_cores_given=True)
        return dataclasses.replace(inputs, **changes) if changes else inputs


def parse_link_gbps(text: str) -> float:
    """Gbit/s from a bandwidth as the storage what-if takes it (10Gbit, 25Gbit/s, 1250MB/s, 800Mbit).
    ValueError says what was expected: a link has a finite bandwidth."""
    from stallscope.analysis.storage_whatif import parse_bandwidth

    spelled = text.strip()
    if spelled.lower().endswith("bit/s"):  # 10Gbit/s: the storage what-if spells bits without /s
        spelled = spelled[:-2]
    elif spelled.endswith("bps"):  # 10Gbps is bits, as NICs are sold (10GBps, bytes, is left as it is)
        spelled = spelled[:-3] + "bit"
    expected = f"a bandwidth above 0 such as 10Gbit/s, 25Gbit or 1250MB/s, got {text.strip()!r}"
    try:
        bytes_per_second = parse_bandwidth(spelled)
    except ValueError:
        raise ValueError(expected) from None
    if not bytes_per_second < math.inf:
        raise ValueError(expected)
    return bytes_per_second * 8 / 1e9


@dataclasses.dataclass(frozen=True)
class ServiceRow:
    """The service with `workers` workers: elements per second, what limits it, what the link carries."""

    workers: int
    elements_per_second: float
    images_per_second: float
    bound: str                           # one of BOUNDS
    link_mb_per_second: float | None     # the bytes on the link at that pace (None: bytes unknown)


@dataclasses.dataclass(frozen=True)
class ServiceSizing:
    """The what-if for 1..max workers, and the answer: how many reach the device's pace, and at what traffic."""

    inputs: ServiceInputs
    rows: tuple[ServiceRow, ...]
    worker_elements_per_second: float    # one worker
    link_elements_per_second: float | None      # the link alone (None: bytes unknown)
    receive_elements_per_second: float | None   # the trainer's receiving alone (None: bytes unknown)
    workers_needed: int | None           # the fewest workers that reach the device; None: the link or trainer caps first
    ceiling: ServiceRow                  # with as many workers as help: the most the service gives
    shipped_bytes_per_element: float | None
    pays_off: bool | None                # the ceiling beats the trainer alone (None: the trainer alone not known)
    host_elements_per_second: float | None = None  # one host's cores for workers and receiving (None: not shared)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def shipped_bytes(inputs: ServiceInputs) -> float | None:
    """Bytes on the link per element: the tensors' bytes, over snappy's ratio where compressed."""
    if inputs.bytes_per_element is None:
        return None
    ratio = inputs.compression_ratio if inputs.compression == "auto" else 1.0
    return inputs.bytes_per_element / ratio


def worker_ms_per_element(inputs: ServiceInputs) -> float:
    """A worker's CPU per element: the pipeline, then sending it (and compressing it, with "auto")."""
    megabytes = (inputs.bytes_per_element or 0.0) / MB
    extra = COMPRESS_MS_PER_MB if inputs.compression == "auto" else 0.0
    return inputs.cpu_ms_per_element + megabytes * (SEND_MS_PER_MB + extra)


def receive_ms_per_element(inputs: ServiceInputs) -> float | None:
    """The trainer's CPU per element received (None: bytes unknown)."""
    if inputs.bytes_per_element is None:
        return None
    return inputs.bytes_per_element / MB * RECEIVE_MS_PER_MB


def _rate(cores: float, ms: float | None) -> float:
    return math.inf if ms is None or ms <= 0 else cores * 1000.0 / ms


def host_rate(inputs: ServiceInputs) -> float:
    """Elements per second one shared host's cores make and receive (inf: the workers have hosts of their own)."""
    if inputs.host_cores is None:
        return math.inf
    return _rate(inputs.host_cores, worker_ms_per_element(inputs) + (receive_ms_per_element(inputs) or 0.0))


def predict(inputs: ServiceInputs, workers: int) -> ServiceRow:
    """The service's pace with `workers` workers: the least of workers, link, receiving and device (and,
    where the workers share the trainer's host, that host's cores)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers: expected an integer >= 1, got {workers!r}")
    shipped = shipped_bytes(inputs)
    rates = {
        "device": inputs.device_elements_per_second,
        "workers": workers * _rate(inputs.worker_cores, worker_ms_per_element(inputs)),
        "link": math.inf if shipped is None else inputs.link_gbps * 1e9 / 8 / shipped,
        "receive": _rate(inputs.trainer_cores, receive_ms_per_element(inputs)),
        "host": host_rate(inputs),
    }
    bound = min(BOUNDS, key=lambda name: rates[name])
    pace = rates[bound]
    return ServiceRow(workers=workers, elements_per_second=pace, images_per_second=pace * inputs.images_per_element,
                      bound=bound, link_mb_per_second=None if shipped is None else pace * shipped / MB)


def size_service(inputs: ServiceInputs, *, max_workers: int = 4) -> ServiceSizing:
    """Rows for 1..max_workers workers (fewer where fewer reach the ceiling; the count that reaches it,
    up to MAX_WORKERS, last), the fewest workers that reach the device's pace (None where the link, the
    trainer's receiving or a shared host caps the service below it), and the ceiling: the most more
    workers give."""
    one = _rate(inputs.worker_cores, worker_ms_per_element(inputs))
    shipped = shipped_bytes(inputs)
    link = math.inf if shipped is None else inputs.link_gbps * 1e9 / 8 / shipped
    receive = _rate(inputs.trainer_cores, receive_ms_per_element(inputs))
    host = host_rate(inputs)
    cap = min(inputs.device_elements_per_second, link, receive, host)
    enough = max(1, min(MAX_WORKERS, math.ceil(cap / one * (1 - 1e-9))))
    needed = enough if inputs.device_elements_per_second <= min(link, receive, host) \
        and enough * one >= cap * (1 - 1e-9) \
        else None
    counts = sorted({*range(1, max(1, min(max_workers, enough)) + 1), enough})
    rows = tuple(predict(inputs, n) for n in counts)
    ceiling = predict(inputs, enough)
    local = inputs.local_elements_per_second
    return ServiceSizing(inputs=inputs, rows=rows, worker_elements_per_second=one,
                         link_elements_per_second=None if math.isinf(link) else link,
                         receive_elements_per_second=None if math.isinf(receive) else receive, workers_needed=needed, ceiling=ceiling,
                         shipped_bytes_per_element=shipped,
                         pays_off=None if local is None else ceiling.elements_per_second > local,
                         host_elements_per_second=None if math.isinf(host) else host)


def decoded_image_bytes(image_size: int, *, channels: int = 3, dtype_bytes: int = 4) -> int:
    """One decoded image as the model takes it: side x side x channels x 4 bytes (float32)."""
    return image_size * image_size * channels * dtype_bytes
