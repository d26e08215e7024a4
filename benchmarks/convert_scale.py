"""Conversion at ImageNet scale: the listing and planning of a 1.28 million file tree, and the
converter's peak memory against the number of images.

  listing   builds a `{class}/{file}` tree of empty files (ImageNet train's shape by default: 1,000
            classes, 1,281,167 files), then times, in a fresh child process, what `stallscope convert`
            does before it reads an image: the scan (`scan_tree`), one stat per file, the seeded shuffle
            and the shard assignment (`plan_conversion`). Prints the seconds, files/s and the child's
            peak RSS; with `--rate IMAGES_PER_S` (a marginal rate from `benchmarks/convert.py`) also the
            time a real ImageNet train conversion would take here.
  memory    for each of `--sizes` (10,000 and 100,000 by default) builds a tree of tiny JPEGs (hard
            links of one valid 32x32 JPEG: real files, few disk blocks) and runs `stallscope convert`
            on it under `/usr/bin/time -v`; prints images/s and the peak RSS of the largest process.
            Flat memory means the peak does not grow with the images' bytes: what grows is the listing
            (a name and a few numbers per file), reported as bytes per file.

  listing --store gcs|s3   the same tree served by the storage emulator as a bucket on loopback
            (`stallscope storage serve`): the listing is the store's, page by page, as `convert
            gs://...` lists a real bucket, and the plan is made from it.

Every tree is made in a temporary folder under `--work` (default: /dev/shm where it exists, since a
million files are made there in about 30 s instead of 15 min on a busy disk; the listing then runs
on warm metadata, as any listing after the first does) and removed at the end.

  python benchmarks/convert_scale.py listing [--files 1281167 --classes 1000 --shards 1024 --rate 3000 --store gcs|s3 --latency-ms 50]
  python benchmarks/convert_scale.py memory [--sizes 10000,100000 --classes 100]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

IMAGENET_TRAIN_FILES = 1_281_167


def make_tree(root: Path, files: int, classes: int, content: Path | None = None) -> None:
    """`files` files spread evenly over `classes` class folders: empty, or hard links of `content`."""
    for c in range(classes):
        folder = root / f"n{c:08d}"
        folder.mkdir(parents=True)
        count = files // classes + (1 if c < files % classes else 0)
        for i in range(count):
            target = folder / f"n{c:08d}_{i}.JPEG"
            if content is None:
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
            else:
                os.link(content, target)


def tiny_jpeg(path: Path) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (120, 80, 40)).save(buffer, format="JPEG", quality=90)
    path.write_bytes(buffer.getvalue())


def plan_child(src: str, out: str, shards: int) -> None:
    """Times the listing and the plan in this (fresh) process; prints one JSON line."""
    from stallscope.records.convert import ConvertOptions, plan_conversion

    started = time.perf_counter()
    plan = plan_conversion(ConvertOptions(src, out, shards=shards))
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime, "candidates": len(plan.candidates),
                      "shards": len(plan.shards), "peak": usage.ru_maxrss * 1024}))


def listing(args: argparse.Namespace, work: Path) -> None:
    src = work / "tree"
    started = time.perf_counter()
    make_tree(src, args.files, args.classes)
    print(f"made {args.files:,} empty files in {args.classes:,} class folders in {time.perf_counter() - started:.1f} s")
    if args.store:
        from stallscope.storage.emulator import emulate

        # The folder served as a bucket on loopback: the child lists it page by page, as from a real store.
        with emulate(src, kind=args.store, latency_s=args.latency_ms / 1000, max_duration_s=1800) as store:
            print(f"served as {store.url} (emulated, {args.latency_ms:g} ms a request)")
            result = _plan_in_child(store.url, work, args.shards, store.env)
    else:
        result = _plan_in_child(str(src), work, args.shards, None)
    timing = json.loads(result.stdout.strip().splitlines()[-1])
    seconds = timing["seconds"]
    print(f"listing + stat + plan of {timing['candidates']:,} files into {timing['shards']} shards: {seconds:.1f} s "
          f"({timing['candidates'] / seconds:,.0f} files/s, target < 30 s for {IMAGENET_TRAIN_FILES:,}); "
          f"peak RSS {timing['peak'] / 2**20:.0f} MiB ({timing['peak'] / timing['candidates']:.0f} bytes a file); "
          f"the listing process's CPU {timing['cpu']:.1f} s (imports included)")
    if args.rate:
        total = seconds * IMAGENET_TRAIN_FILES / timing["candidates"] + IMAGENET_TRAIN_FILES / args.rate
        print(f"ImageNet train ({IMAGENET_TRAIN_FILES:,} images) at {args.rate:,.0f} images/s: about {total / 60:.0f} min "
              f"({total / 3600:.2f} h) including the listing")


def _plan_in_child(src: str, work: Path, shards: int, env: dict[str, str] | None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, __file__, "plan-child", src, str(work / "out"), str(shards)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, **env} if env else None)
    if result.returncode != 0:
        sys.exit(f"listing failed:\n{result.stderr}")
    return result


def peak_and_seconds(report: str) -> tuple[int, float]:
    """Peak RSS in bytes and elapsed seconds from `/usr/bin/time -v`'s report."""
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report).group(1)) * 1024
    clock = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", report).group(1)
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    return peak, seconds


def memory(args: argparse.Namespace, work: Path) -> None:
    if not os.access("/usr/bin/time", os.X_OK):
        sys.exit("memory: needs GNU time at /usr/bin/time (apt-get install time)")
    image = work / "tiny.jpg"
    tiny_jpeg(image)
    runner = "import sys; from stallscope.cli.main import main; sys.exit(main(sys.argv[1:]))"
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        src, out = work / f"tree-{size}", work / f"out-{size}"
        make_tree(src, size, args.classes, content=image)
        cmd = ["/usr/bin/time", "-v", sys.executable, "-c", runner, "convert", str(src), "--output_path", str(out),
               "--shards", str(args.shards), "--no-progress"]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            sys.exit(f"convert of {size} files failed:\n{result.stderr[-3000:]}")
        peak, seconds = peak_and_seconds(result.stderr)
        rows.append((size, seconds, peak))
        print(f"{size:>9,} tiny JPEGs: {seconds:6.1f} s, {size / seconds:7,.0f} images/s (start-up included), "
              f"peak RSS {peak / 2**20:6.0f} MiB", flush=True)
        shutil.rmtree(src)
        shutil.rmtree(out)
    if len(rows) >= 2:
        (n1, _, p1), (n2, _, p2) = rows[0], rows[-1]
        print(f"peak RSS grows {(p2 - p1) / (n2 - n1):.0f} bytes per file listed from {n1:,} to {n2:,} files "
              f"(x{n2 / n1:.0f} files: x{p2 / p1:.2f} peak RSS)")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "plan-child":
        plan_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("listing", "memory"))
    parser.add_argument("--files", type=int, default=IMAGENET_TRAIN_FILES, help="listing: files in the tree")
    parser.add_argument("--classes", type=int, default=None, help="class folders (listing: 1000, memory: 100)")
    parser.add_argument("--shards", type=int, default=None, help="shards (listing: 1024, memory: 16)")
    parser.add_argument("--store", choices=("gcs", "s3"), default=None,
                        help="listing: list the tree through the emulated store (gs:// or s3://) instead of the file system")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="listing --store: the emulated store's latency per request (a real bucket's page: 30-100 ms)")
    parser.add_argument("--rate", type=float, default=None, help="listing: a measured images/s for the ImageNet estimate")
    parser.add_argument("--sizes", default="10000,100000", help="memory: numbers of images, comma-separated")
    parser.add_argument("--work", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where the temporary folder is made (default: /dev/shm, else the system's)")
    args = parser.parse_args()
    args.classes = args.classes or (1000 if args.mode == "listing" else 100)
    args.shards = args.shards or (1024 if args.mode == "listing" else 16)
    work = Path(tempfile.mkdtemp(prefix="convert-scale-", dir=args.work))
    try:
        (listing if args.mode == "listing" else memory)(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
