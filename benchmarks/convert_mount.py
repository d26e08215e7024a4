"""Converting from a network file system: `stallscope convert` reading each worker's files in turn
(`--read-ahead 0`, how it read before) against reading ahead of the checks (`--read-ahead auto`, the
default, and any fixed depths asked for), with the same tree converted from local disk as the floor,
in one run.

The network file system is stallscope's own emulator, `stallscope storage serve DIR --mount MNT
--latency L`: a real FUSE mount of the folder that holds every open, read and listing for L, on
this machine, so its server's CPU is taken from the converter's cores (it is printed). A real NFS
server answers from another machine. Every run is a fresh `stallscope convert` process; the tree is
the built-in data set (`--classes` x `--images-per-class`, in train and validation).

With `--output-latency-ms`, also the other way round: from local disk into an empty folder of a
writable mount (`--mount MNT --writable`) at each latency, every create, write, fsync and rename held
for it, against converting into local disk; the shards are checked to be the same bytes.

  python benchmarks/convert_mount.py [--latency-ms 5,20 --depths 0,auto --repeats 3 --workers N]
  python benchmarks/convert_mount.py --latency-ms '' --output-latency-ms 2,20

Needs /dev/fuse, fuse3 and mfusepy (`make test` installs them where it can).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from stallscope.data.synthetic import SyntheticOptions, make_synthetic  # noqa: E402
from stallscope.records.convert import default_workers  # noqa: E402
from stallscope.storage.emulator import emulate  # noqa: E402
from stallscope.storage.emulator.fuse_mount import why_no_fuse  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and of its children it has waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / TICKS


def convert_once(src: Path, out: Path, read_ahead: str, workers: int, keep: bool = False) -> tuple[float, str]:
    """(wall seconds, the summary's reads line) of one `stallscope convert` in a fresh process; `keep`
    leaves the output for a comparison."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "stallscope", "convert", str(src), "--output-path", str(out), "--no-progress",
           "--workers", str(workers), "--read-ahead", read_ahead]
    started = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode:
        sys.exit(f"convert failed:\n{result.stderr}")
    reads = next((line.strip() for line in result.stdout.splitlines() if line.strip().startswith("reads:")), "")
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return elapsed, reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--images-per-class", type=int, default=150)
    parser.add_argument("--latency-ms", default="5", help="the mount's latency per request, a list: 2,5,20")
    parser.add_argument("--depths", default="0,auto", help="--read-ahead values to time from the mount")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--output-latency-ms", default="",
                        help="also convert into a writable mount at these latencies, a list: 2,20")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    if why := why_no_fuse():  # not a failure of the code measured: `make bench` goes on
        print(f"benchmarks/convert_mount.py: skipped, it needs a FUSE mount: {why}")
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="convert-mount-"))
    try:
        run(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    src = work / "tree"
    if not src.exists():
        make_synthetic(src, SyntheticOptions(classes=args.classes, images_per_class=args.images_per_class, seed=0))
    files = list(src.rglob("*.jpg"))
    size = sum(p.stat().st_size for p in files)
    depths = [d for d in args.depths.split(",") if d]
    print(f"{len(files)} JPEGs ({size / 1e6:.1f} MB), {args.workers} workers, {os.cpu_count()} cores, "
          f"median of {args.repeats} runs, each a fresh process")
    local = statistics.median(convert_once(src, work / "out", "0", args.workers)[0] for _ in range(args.repeats))
    print(f"{'local disk':<24} {local:>7.2f} s {len(files) / local:>8.0f} images/s")
    for latency_ms in (float(v) for v in args.latency_ms.split(",") if v):
        mount = work / "mnt"
        mount.mkdir(exist_ok=True)
        with emulate(src, kind="mount", mount_point=mount, latency_s=latency_ms / 1e3, max_duration_s=3600) as store:
            times: dict[str, float] = {}
            for depth in depths:
                runs, server_cpu, reads = [], [], ""
                for _ in range(args.repeats):
                    before = cpu_seconds(store.pid)
                    elapsed, reads = convert_once(mount, work / "out", depth, args.workers)
                    runs.append(elapsed)
                    server_cpu.append(cpu_seconds(store.pid) - before)
                times[depth] = statistics.median(runs)
                label = f"mount {latency_ms:g} ms, ahead {depth}"
                print(f"{label:<24} {times[depth]:>7.2f} s {len(files) / times[depth]:>8.0f} images/s, "
                      f"the mount's server {statistics.median(server_cpu):.2f} CPU s  {reads}")
        if "0" in times:
            for depth in depths:
                if depth != "0":
                    print(f"  at {latency_ms:g} ms, ahead {depth} against in turn: {times['0'] / times[depth]:.2f}x "
                          f"as fast; against local disk: {local / times[depth]:.2f}x")
    for latency_ms in (float(v) for v in args.output_latency_ms.split(",") if v):
        into_mount(args, work, src, len(files), local, latency_ms)


def into_mount(args: argparse.Namespace, work: Path, src: Path, images: int, local: float, latency_ms: float) -> None:
    """Local disk into a writable mount at `latency_ms`: median seconds against into local disk."""
    served, mount = work / "served", work / "mnt-out"
    shutil.rmtree(served, ignore_errors=True)
    served.mkdir()
    mount.mkdir(exist_ok=True)
    convert_once(src, work / "local-out", "auto", args.workers, keep=True)
    with emulate(served, kind="mount", mount_point=mount, latency_s=latency_ms / 1e3, writable=True,
                 max_duration_s=3600) as store:
        runs, server_cpu = [], []
        for repeat in range(args.repeats):
            before = cpu_seconds(store.pid)
            runs.append(convert_once(src, mount / "out", "auto", args.workers, keep=repeat == args.repeats - 1)[0])
            server_cpu.append(cpu_seconds(store.pid) - before)
    shards = sorted(p.name for p in (work / "local-out").glob("*.tfrecord"))
    same = shards and all((served / "out" / name).read_bytes() == (work / "local-out" / name).read_bytes()
                          for name in shards)
    into = statistics.median(runs)
    label = f"into mount {latency_ms:g} ms"
    print(f"{label:<24} {into:>7.2f} s {images / into:>8.0f} images/s, the mount's server "
          f"{statistics.median(server_cpu):.2f} CPU s; {len(shards)} shards {'the same bytes' if same else 'DIFFERENT'} "
          f"as into local disk; against local disk: {local / into:.2f}x")


if __name__ == "__main__":
    main()
