"""Starts one emulated store in this process: the folder's server (GCS or S3 dialect), behind the
latency proxy where it shapes bandwidth or TLS handshakes, or the slow FUSE mount; knows the URL and
environment a reader needs.

`stallscope storage serve` runs this in the foreground; `emulator.emulate` runs that command as a
child process. Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shlex
import threading
from pathlib import Path

from stallscope.errors import UsageError
from stallscope.storage.emulator.counters import SharedCounters

KINDS = ("gcs", "s3", "mount")


@dataclasses.dataclass(frozen=True)
class StoreOptions:
    """One emulated store.

    root: the folder served. kind: 'gcs', 's3' or 'mount'.
    latency_s: held per request burst (HTTP stores: by the server's event loop, or by the latency proxy
        where a bandwidth cap makes one run) or per open/read/listing (mount); 0 for none.
    bandwidth_bps: a shared cap in bits per second per direction; None for none.
    bucket: the bucket name of gs://BUCKET or s3://BUCKET. mount_point: an empty folder (mount only).
    port: the port readers connect to on 127.0.0.1; 0 takes a free one.
    writable: the HTTP stores take uploads, copies and deletes into root, the mount creates, writes,
        renames and deletes there, each at the latency (read-only otherwise).
    """

    root: Path
    kind: str = "gcs"
    latency_s: float = 0.0
    bandwidth_bps: float | None = None
    bucket: str = "data"
    mount_point: Path | None = None
    port: int = 0
    writable: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.latency_s >= 0:
            raise UsageError(f"latency_s: expected a latency >= 0 s, got {self.latency_s!r}")
        if self.bandwidth_bps is not None and not self.bandwidth_bps > 0:
            raise UsageError(f"bandwidth_bps: expected a bandwidth above 0 bit/s, got {self.bandwidth_bps!r}")
        if not _valid_bucket(self.bucket):
            raise UsageError(f"bucket: expected a bucket name (3-63 of a-z, 0-9, '-', '_', '.'), got {self.bucket!r}")
        if not 0 <= int(self.port) <= 65535:
            raise UsageError(f"port: expected a port in 0..65535, got {self.port!r}")
        if self.kind == "mount" and self.mount_point is None:
            raise UsageError("mount_point: expected a folder to mount at for kind 'mount', got nothing")


def _valid_bucket(name: str) -> bool:
    return 3 <= len(name) <= 63 and all(c.islower() or c.isdigit() or c in "-_." for c in name) \
        and name[0].isalnum() and name[-1].isalnum()


def check_surroundings(options: StoreOptions) -> None:
    """Raises UsageError naming the folder or flag when the store cannot start here."""
    root = Path(options.root)
    if not root.is_dir():
        raise UsageError(f"DIR: expected an existing folder to serve, got {str(root)!r}"
                         + (" (a file)" if root.exists() else " (it does not exist)"))
    if options.kind == "mount":
        from stallscope.storage.emulator.fuse_mount import why_no_fuse

        point = Path(options.mount_point)
        _check_not_stale(point)
        if not point.is_dir():
            raise UsageError(f"--mount: expected an empty folder to mount at, got {str(point)!r}"
                             + (" (not a folder)" if point.exists() else " (it does not exist)"))
        if os.path.ismount(point) or any(point.iterdir()):
            raise UsageError(f"--mount: expected an empty folder to mount at, got {str(point)!r} (not empty)")
        if point.resolve() == root.resolve() or root.resolve() in point.resolve().parents:
            raise UsageError(f"--mount: expected a folder outside DIR, got {str(point)!r} (inside {str(root)!r})")
        why = why_no_fuse()
        if why:
            raise UsageError(f"--mount: expected FUSE on this machine, got {why}")


def _check_not_stale(point: Path) -> None:
    """A FUSE mount whose daemon died (killed -9) stays mounted and answers ENOTCONN to every call: only
    an unmount clears it. Listed, not stat'ed: the kernel answers a stat from its cache for a second."""
    try:
        os.listdir(point)
    except OSError as exc:
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            raise UsageError(f"--mount: {str(point)!r} is a stale mount (its FUSE daemon ended without unmounting: "
                             f"{os.strerror(exc.errno)}); expected an empty folder: run "
                             f"`fusermount3 -u {shlex.quote(str(point))}` first") from None


# The variable naming the live counters file of the store the other variables reach (its layout beside
# it); storage/served_counters.py reads it, so a run on the store reports what the store saw.
COUNTERS_ENV = "STALLSCOPE_STORE_COUNTERS"


class RunningStore:
    """A started store. `url` and `env` say how to read it; `stop()` ends it."""

    def __init__(self, options: StoreOptions, state_dir: Path) -> None:
        self.options = options
        self.state_dir = Path(state_dir)
        self.counters = SharedCounters(self.state_dir / "counters.bin", create=True)
        self._servers: list = []
        self._mount = None
        self.port = 0
        self.server_port = 0
        self.url = ""
        self.env: dict[str, str] = {}

    # ----- start
    def start(self) -> "RunningStore":
        try:
            if self.options.kind == "mount":
                self._start_mount()
            else:
                self._start_http()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_http(self) -> None:
        from stallscope.storage.emulator.folder_bucket import FolderBucket

        options = self.options
        bucket = FolderBucket(options.root, options.bucket, writable=options.writable)
        # Each request's round trip is waited out by the server's event loop itself (a timer per request;
        # for gs://, also one per TLS handshake after a CONNECT); the relay is for what only it can shape,
        # a bandwidth cap. On 2 cores, relaying each 75 KB GET cost the store's process ~0.3 ms of CPU
        # (python benchmarks/s3_reader.py --latency 10).
        in_server = not options.bandwidth_bps
        shaped = bool(options.bandwidth_bps or (options.latency_s and not in_server))
        store_port = 0 if shaped else options.port
        try:
            if options.kind == "gcs":
                from stallscope.storage.emulator.gcs_server import GcsServer
                from stallscope.storage.emulator.certificate_authority import server_context

                ca_path = self.state_dir / "ca.pem"
                server = GcsServer(store_port, bucket, self.counters, server_context(ca_path),
                                   latency_s=options.latency_s if in_server else 0.0)
            else:
                from stallscope.storage.emulator.s3_server import S3Server

                server = S3Server(store_port, bucket, self.counters, latency_s=options.latency_s if in_server else 0.0)
            self._serve(server.serve_forever, server.shutdown, server.server_close)
            self.server_port = server.port
            self.port = server.port
            if shaped:
                from stallscope.storage.emulator.latency_proxy import LatencyProxy

                proxy = LatencyProxy(options.port, server.port, latency_s=options.latency_s,
                                     bandwidth_bps=options.bandwidth_bps)
                self._serve(proxy.serve_forever, proxy.shutdown)
                self.port = proxy.port
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"--port: expected a free port on 127.0.0.1, got {options.port} (in use)") from None
            raise
        address = f"127.0.0.1:{self.port}"
        if options.kind == "gcs":
            self.url = f"gs://{options.bucket}"
            self.env = {
                "HTTPS_PROXY": f"http://{address}", "https_proxy": f"http://{address}",
                "CURL_CA_BUNDLE": str(self.state_dir / "ca.pem"),
                "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulated", "NO_GCE_CHECK": "true",
                "STORAGE_EMULATOR_HOST": f"http://{address}",
            }
        else:
            self.url = f"s3://{options.bucket}"
            self.env = {
                "AWS_ENDPOINT_URL": f"http://{address}", "AWS_ENDPOINT_URL_S3": f"http://{address}",
                "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
            }
        self.env[COUNTERS_ENV] = str(self.counters.path)  # where a reader finds what the store served

    def _serve(self, loop, *stops) -> None:
        threading.Thread(target=loop, daemon=True, name="storage-server").start()
        self._servers.append(stops)

    def _start_mount(self) -> None:
        from stallscope.storage.emulator.fuse_mount import FuseMount

        options = self.options
        self._mount = FuseMount(options.root, options.mount_point, latency_s=options.latency_s,
                                bandwidth_bps=options.bandwidth_bps, counters=self.counters, writable=options.writable)
        self._mount.start()
        self.url = str(self._mount.mount_point)  # resolved before libfuse moved the process to /

    # ----- stop
    def stop(self) -> None:
        if self._mount is not None:
            self._mount.unmount()
            self._mount = None
        for stops in reversed(self._servers):
            for stop in stops:
                try:
                    stop()
                except OSError:
                    pass
        self._servers.clear()

    def describe(self) -> dict:
        """What a reader needs, as JSON-ready data (the serve command's --ready-file)."""
        return {"kind": self.options.kind, "url": self.url, "env": self.env, "pid": os.getpid(),
                "port": self.port, "server_port": self.server_port, "root": str(Path(self.options.root).resolve()),
                "latency_s": self.options.latency_s, "bandwidth_bps": self.options.bandwidth_bps,
                "writable": self.options.writable,
                "counters_map": str(self.counters.path)}
