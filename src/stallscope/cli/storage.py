"""Emulate remote storage on this machine: a local folder served as a GCS or S3 bucket on loopback,
or as a FUSE mount, with a latency per request and a shared bandwidth cap.

  stallscope storage serve data --gcs --latency 10ms --bandwidth 200Mbit     # gs://data
  stallscope storage serve data --s3 --latency 10ms                          # s3://data
  stallscope storage serve data --mount /mnt/slow --latency 10ms             # a slow file system
  stallscope storage serve out --gcs --writable                               # gs://data takes writes into out/
  stallscope storage serve out --mount /mnt/out --writable --latency 2ms      # a slow file system to write to

It prints the environment (export lines) or the path readers use, then serves in the foreground until
Ctrl-C, SIGTERM or --for; scripts start it in the background and read --ready-file.

  stallscope storage probe s3://my-bucket/images      # a real (or emulated) bucket's round trip and transfer
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from stallscope.cli.flags import (
    add_common_flags,
    add_flag,
    add_storage_flag,
    creatable_dir,
    creatable_file,
    duration,
    non_negative_int,
    positive_int,
)

# How often the counters file is brought up to date (rewritten only when a counter moved): often
# enough that `diagnose --storage-counters`, reading it right after its probe, misses little.
COUNTERS_EVERY_S = 0.02
# How often a store with no counters file looks at its deadline and its parent: waking 50 times a second
# cost ~1.4% of a core, which a benchmark would count as the store's CPU per request.
CHECK_EVERY_S = 0.25


def _latency(text: str) -> float:
    """Seconds, from the what-if's latency form (10ms, 500us, 0.1s); a bare 0 is no latency."""
    from stallscope.analysis.storage_whatif import parse_latency_ms

    if text.strip() == "0":
        return 0.0
    try:
        return parse_latency_ms(text) / 1000.0
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {exc}") from None


def _bandwidth(text: str) -> float | None:
    """Bits per second, from the what-if's bandwidth form (200Mbit, 1Gbit, 25MB/s); 'unlimited' is None."""
    import math

    from stallscope.analysis.storage_whatif import parse_bandwidth

    try:
        bytes_per_s = parse_bandwidth(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {exc}") from None
    return None if math.isinf(bytes_per_s) else bytes_per_s * 8


def add_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(parser))
    serve = actions.add_parser("serve", help="serve a folder as an emulated bucket or mount",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(serve)
    serve.add_argument("root", metavar="DIR", help="the folder to serve (read-only unless --writable)")
    kind = serve.add_mutually_exclusive_group()
    kind.add_argument("--gcs", dest="kind", action="store_const", const="gcs",
                      help="a GCS store TensorFlow's gs:// reads (the default)")
    kind.add_argument("--s3", dest="kind", action="store_const", const="s3", help="an S3-compatible store")
    kind.add_argument("--mount", dest="mount_point", metavar="MNT", type=Path,
                      help="a FUSE mount at MNT, an empty folder (needs /dev/fuse and fuse3). Its limits: reads reach "
                           "it in pieces of at most 128 KiB (the kernel's FUSE read-ahead, which a mount made without "
                           "root cannot raise), so a 1 MiB read is 8 requests where NFS (rsize 1 MiB) makes one; it "
                           "serves 64 calls at once, and more queue")
    add_flag(serve, "latency", type=_latency, default=0.0, metavar="DURATION",
             help="held per request (HTTP stores: per request burst; mount: per open, read and listing, and "
                  "with --writable per create, write, fsync, rename, mkdir and unlink); "
                  "0 for none (default: 0)")
    add_flag(serve, "bandwidth", type=_bandwidth, default=None, metavar="RATE",
             help="shared cap per direction, e.g. 200Mbit, 1Gbit, 25MB/s (default: unlimited)")
    add_flag(serve, "writable", action="store_true",
             help="take uploads, copies and deletes into DIR (--gcs, --s3), e.g. to convert into the bucket; "
                  "each object lands whole or not at all; a --mount takes writes, renames and deletes "
                  "(default: read-only)")
    add_flag(serve, "bucket", default="data", help="the bucket name: gs://NAME, s3://NAME (default: data)")
    add_flag(serve, "port", type=non_negative_int, default=0,
             help="port on 127.0.0.1 readers connect to (default: 0, a free one)")
    add_flag(serve, "for", dest="for_s", type=duration, default=None, metavar="DURATION",
             help="stop by itself after this long, e.g. 10m (default: until Ctrl-C or SIGTERM)")
    add_flag(serve, "counters", type=creatable_file, default=None, metavar="FILE",
             help="keep the counters (requests, connections, bytes, cumulative) as JSON here, rewritten within "
                  "20 ms of a change and at exit: the file diagnose --storage-counters reads")
    add_flag(serve, "ready_file", type=creatable_file, default=None, metavar="FILE",
             help="write what readers need (url, env, pid) as JSON here once the store answers")
    add_flag(serve, "state_dir", type=creatable_dir, default=None, metavar="DIR",
             help="where the test CA and live counters are kept (default: a temporary folder removed at exit)")
    add_flag(serve, "parent_pid", type=non_negative_int, default=0, help=argparse.SUPPRESS)
    serve.set_defaults(kind=None)

    probe = actions.add_parser("probe", help="measure a bucket: its round trip and transfer, as a what-if spec",
                               description=PROBE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(probe)
    probe.add_argument("url", metavar="URL", help="gs://bucket/prefix or s3://bucket/prefix")
    add_flag(probe, "round_trips", type=positive_int, default=24, metavar="N",
             help="one-byte GETs timed one at a time (default: 24)")
    add_flag(probe, "in_flight", type=positive_int, default=16, metavar="N",
             help="whole-object GETs at once while reading the largest objects (default: 16)")
    add_flag(probe, "seconds", type=duration, default=5.0, metavar="DURATION",
             help="how long to read objects, e.g. 5s (default: 5s; at most 1 GB is read)")
    add_flag(probe, "json", action="store_true", help="print the figures as JSON")
    add_storage_flag(probe)


PROBE_DOC = """Measure what a bucket gives this machine, with no pipeline around it: its round trip (one-byte
GETs, one at a time), then whole-object GETs of its largest objects, many in flight. Ends with the
--what-if-storage spec of the store, for a diagnosis of data still on local disk.

  stallscope storage probe s3://my-bucket/images
  stallscope storage probe gs://my-bucket/tfrecords --in-flight 32 --seconds 10 --json
"""


def run_probe(args: argparse.Namespace) -> int:
    from stallscope.analysis.store_probe import ProbeOptions, probe_store

    result = probe_store(ProbeOptions(url=args.url, round_trips=args.round_trips, in_flight=args.in_flight,
                                      seconds=args.seconds))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print("\n".join(probe_lines(result)))
    return 0


def probe_lines(result) -> list[str]:
    """The probe's report: the store's objects, round trip, transfer and what-if spec."""
    trip = result.round_trip_ms
    mean = result.bytes_read / result.objects_read if result.objects_read else 0
    lines = [f"store        {result.url}: {result.objects:,} objects, {result.total_bytes / 1e6:,.1f} MB, "
             f"listed in {result.listing_s:.2f} s"]
    if trip["p10"] is None:
        lines.append("round trip   not measured (no object answered a one-byte GET)")
    else:
        lines.append(f"round trip   {result.round_trips} one-byte GETs, one at a time: fastest tenth {trip['p10']:.1f} ms, "
                     f"median {trip['p50']:.1f}, p90 {trip['p90']:.1f}")
    get = f"; a GET took {result.get_ms_median:.1f} ms (median)" if result.get_ms_median is not None else ""
    lines.append(f"transfer     {result.in_flight} in flight, {result.objects_read:,} objects (largest first, "
                 f"{mean / 1e3:,.1f} KB mean): {result.bytes_read / 1e6:,.1f} MB in {result.transfer_s:.2f} s, "
                 f"{result.bytes_per_s / 1e6:,.1f} MB/s{get}")
    if result.bandwidth_bytes_per_s is None:
        lines.append("             bound by requests, not bandwidth: the objects are under 4 MiB (bandwidth is "
                     "measured on larger ones)")
    if result.what_if_spec:
        lines.append(f"what-if      --what-if-storage {result.what_if_spec}   (round trip less {result.client}'s "
                     "own overhead per request)")
    return lines


def _options(args: argparse.Namespace):
    from stallscope.storage.emulator.serving import StoreOptions

    kind = "mount" if args.mount_point is not None else (args.kind or "gcs")
    return StoreOptions(root=Path(args.root), kind=kind, latency_s=args.latency, bandwidth_bps=args.bandwidth,
                        bucket=args.bucket, mount_point=args.mount_point, port=args.port, writable=args.writable)


def _print_usage(store) -> None:
    from stallscope.analysis.storage_whatif import TF_GCS_DEFAULT_BLOCK_MB
    from stallscope.storage.gcs_store import GCS_BLOCK_VAR
    from stallscope.analysis.storage_whatif import format_bandwidth, format_latency

    bandwidth = store.options.bandwidth_bps / 8 if store.options.bandwidth_bps else float("inf")
    shaping = f"{format_latency(store.options.latency_s * 1000)} per request, bandwidth {format_bandwidth(bandwidth)}"
    if store.options.kind == "mount":
        print(f"# {store.options.root} mounted read-only at {store.url} ({shaping})")
        print(f"export STALLSCOPE_STORAGE_URL={store.url}")
    else:
        print(f"# {store.options.root} served as {store.url} on 127.0.0.1:{store.port} ({shaping}); "
              + ("writable" if store.options.writable else "read-only"))
        for name, value in store.env.items():
            print(f"export {name}={value}")
        if store.options.kind == "gcs":
            print(f"# TF's gs:// buffers {TF_GCS_DEFAULT_BLOCK_MB} MB per opened object; for a JPEG tree read by your own "
                  f"code also export {GCS_BLOCK_VAR}=1 (stallscope's commands set it themselves)")
        print(f"export STALLSCOPE_STORAGE_URL={store.url}")
    print("# Ctrl-C or SIGTERM stops it", flush=True)


def _write_json(path: Path, data: dict) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(temporary, path)


def run(args: argparse.Namespace) -> int:
    if args.action == "probe":
        return run_probe(args)
    from stallscope.storage.emulator.serving import RunningStore, check_surroundings
    from stallscope.storage.emulator.state_dirs import new_state_dir

    _resolve_paths(args)
    options = _options(args)
    check_surroundings(options)
    own_state = args.state_dir is None
    state_dir = new_state_dir() if own_state else args.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    store = RunningStore(options, state_dir)
    try:
        store.start()
        _print_usage(store)
        written = None
        if args.counters:  # before the ready file: whoever waits for that may read the counters at once
            written = _update_counters(store, args.counters, written)
        if args.ready_file:
            _write_json(Path(args.ready_file), store.describe())
        deadline = time.monotonic() + args.for_s if args.for_s else None
        while not stop.is_set():
            if args.counters:
                written = _update_counters(store, args.counters, written)
            if deadline is not None and time.monotonic() >= deadline:
                break
            if args.parent_pid and not _alive(args.parent_pid):
                break
            every = COUNTERS_EVERY_S if args.counters else CHECK_EVERY_S
            wait = every if deadline is None else min(every, max(0.0, deadline - time.monotonic()))
            stop.wait(wait)
    finally:
        store.stop()
        if args.counters:
            store.counters.write_json(args.counters, kind=options.kind, url=store.url)
        final = store.counters.snapshot()
        store.counters.close()
        if own_state:
            shutil.rmtree(state_dir, ignore_errors=True)
    print(f"# stopped: {final.requests} requests, {final.connections} connections, "
          f"{final.bytes} bytes sent", file=sys.stderr, flush=True)
    return 0


def _resolve_paths(args: argparse.Namespace) -> None:
    """Every path flag made absolute against the folder the command was started in: a --mount's libfuse
    moves the process to / once the mount is up, where a relative --ready-file would land in /."""
    for name in ("root", "mount_point", "counters", "ready_file", "state_dir"):
        if getattr(args, name) is not None:
            setattr(args, name, Path(os.path.abspath(getattr(args, name))))


def _update_counters(store, path: Path, written):
    """Rewrites the counters file (atomically) when a counter moved since `written`; returns what it holds."""
    now = store.counters.snapshot()
    if now != written:
        store.counters.write_json(path, kind=store.options.kind, url=store.url)
    return now


def _alive(parent_pid: int) -> bool:
    """The process that started us still runs (a dead parent leaves us to init: our parent changes)."""
    return os.getppid() == parent_pid
