"""Unpacking ILSVRC2012 train's shape: `stallscope prepare imagenet-train` against the shell recipe most
guides give, and against one read of the archive, in one run, on the same archive.

Builds an archive of the original's shape in `--work`: `--classes` class archives (`n00000000.tar`
...), each of `--per-class` JPEG files of about `--kb` KB (one photo-like JPEG's bytes, renamed; the
original averages 110 KB), inside one outer tar. Then times, each in a fresh process, `--repeats`
times in turn, the output removed between runs:

  read        the outer archive read once in 1 MiB pieces: the floor for anything that reads it
  tar-twice   the shell recipe (fb.resnet.torch's INSTALL.md, and the guides that copy it): GNU tar
              unpacks the outer archive, then each class archive into its folder, then removes it
  stallscope  `prepare_imagenet_train`: both levels read in order, each file written under a
              temporary name and renamed, its head sniffed
  again       stallscope once more over its finished output: what a resumed run spends passing over
              the files already in place (a seek past each, not a read)

Prints each way's median seconds, files/s, MB/s, the bytes it wrote (write calls, its tools' included:
on a disk, what the recipe's unpacked class archives cost twice) and peak RSS (tar's own, or the Python
process's), and stallscope's ratios. The archive and the outputs are removed at the end.

  python benchmarks/prepare_train.py [--classes 25 --per-class 400 --kb 110 --repeats 3 --work /dev/shm]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

WAYS = ("read", "tar-twice", "stallscope", "again")
TAR_TWICE = r"""
set -e
mkdir -p "$2" && tar -xf "$1" -C "$2" && cd "$2"
find . -name "*.tar" | while read NAME ; do mkdir -p "${NAME%.tar}"; tar -xf "${NAME}" -C "${NAME%.tar}"; rm -f "${NAME}"; done
"""


def photo_like_jpeg(kb: int) -> bytes:
    """A JPEG of about `kb` KB: smooth gradients under noise, as a photograph compresses."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    height, width = 375, 500
    gradient = np.linspace(0, 255, width)[None, :, None] * np.ones((height, 1, 3))
    best = b""
    for noise in range(4, 120, 4):
        pixels = np.clip(gradient + rng.normal(0, noise, (height, width, 3)), 0, 255).astype("uint8")
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        best = buffer.getvalue()
        if len(best) >= kb * 1000:
            break
    return best


def build_archive(path: Path, classes: int, per_class: int, jpeg: bytes) -> tuple[int, int]:
    """The outer archive, class archives made in memory one at a time; returns (files, bytes of files)."""
    with tarfile.open(path, "w") as outer:
        for c in range(classes):
            synset = f"n{c:08d}"
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as archive:
                for i in range(per_class):
                    info = tarfile.TarInfo(f"{synset}_{i}.JPEG")
                    info.size, info.mtime = len(jpeg), 1_340_000_000
                    archive.addfile(info, io.BytesIO(jpeg))
            info = tarfile.TarInfo(f"{synset}.tar")
            info.size, info.mtime = inner.tell(), 1_340_000_000
            inner.seek(0)
            outer.addfile(info, inner)
    return classes * per_class, classes * per_class * len(jpeg)


def _written() -> int:
    """Bytes this process and its waited-for children passed to write calls (Linux's /proc/self/io)."""
    with open("/proc/self/io") as io_file:
        return next(int(line.split()[1]) for line in io_file if line.startswith("wchar:"))


def child(way: str, archive: str, out: str) -> None:
    """Runs one way once in this fresh process; prints one JSON line."""
    if way in ("stallscope", "again"):
        from stallscope.data.imagenet_train import prepare_imagenet_train
    written = _written()
    started = time.perf_counter()
    if way == "read":
        with open(archive, "rb", buffering=0) as raw:
            while raw.read(1 << 20):
                pass
    elif way == "tar-twice":
        subprocess.run(["bash", "-c", TAR_TWICE, "tar-twice", archive, out], check=True)
    else:
        report = prepare_imagenet_train(archive, out)
        assert report.complete and (report.in_place if way == "again" else report.placed), report
    seconds = time.perf_counter() - started
    written = _written() - written
    if way == "tar-twice":  # tar's own peak, the largest of its runs (it may carry bash's from before exec)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    else:  # this process's own: VmHWM starts afresh at exec, where ru_maxrss keeps the parent's peak
        with open("/proc/self/status") as status:
            peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024
    print(json.dumps({"seconds": seconds, "peak": peak, "written": written}))


def time_way(way: str, archive: Path, out: Path) -> tuple[float, int, int]:
    """(seconds, peak RSS, bytes written) of one run in a fresh process."""
    shutil.rmtree(out, ignore_errors=True)
    for step in ("stallscope", way) if way == "again" else (way,):  # "again" runs over a finished output
        result = subprocess.run([sys.executable, __file__, "--child", step, str(archive), str(out)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            sys.exit(f"{step} failed:\n{result.stderr}")
    timing = json.loads(result.stdout.strip().splitlines()[-1])
    shutil.rmtree(out, ignore_errors=True)
    return timing["seconds"], timing["peak"], timing["written"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=25)
    parser.add_argument("--per-class", type=int, default=400)
    parser.add_argument("--kb", type=int, default=110, help="about this many KB a JPEG (ILSVRC2012 train: 110)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--child", nargs=3, metavar=("WAY", "ARCHIVE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    with tempfile.TemporaryDirectory(prefix="prepare-train-", dir=args.work) as work:
        archive, out = Path(work) / "ILSVRC2012_img_train.tar", Path(work) / "train"
        files, data_bytes = build_archive(archive, args.classes, args.per_class, photo_like_jpeg(args.kb))
        print(f"archive: {args.classes} class archives, {files:,} JPEGs of {data_bytes / files / 1e3:.0f} KB, "
              f"{archive.stat().st_size / 1e6:.0f} MB, in {work}; median of {args.repeats}")
        runs: dict[str, list[tuple[float, int, int]]] = {way: [] for way in WAYS}
        for _ in range(args.repeats):
            for way in WAYS:
                runs[way].append(time_way(way, archive, out))
        seconds = {}
        print(f"{'way':<12} {'seconds':>8} {'files/s':>9} {'MB/s':>7} {'written':>10} {'peak RSS':>10}")
        for way in WAYS:
            seconds[way] = statistics.median(s for s, _, _ in runs[way])
            peak = max(p for _, p, _ in runs[way])
            written = statistics.median(w for _, _, w in runs[way])
            print(f"{way:<12} {seconds[way]:>8.2f} {files / seconds[way]:>9,.0f} {data_bytes / 1e6 / seconds[way]:>7.0f} "
                  f"{written / 1e6:>7.0f} MB {peak / 2**20:>6.0f} MiB")
        print(f"stallscope / tar-twice: {seconds['tar-twice'] / seconds['stallscope']:.2f}x as fast (the shell recipe)")
        print(f"stallscope / read: {seconds['read'] / seconds['stallscope']:.2f}x of one read of the archive (the floor)")
        print(f"again / stallscope: a rerun over the finished output takes {seconds['again'] / seconds['stallscope']:.2f}x "
              f"the first run's time")
        rate = files / seconds["stallscope"]
        print(f"ILSVRC2012 train (1,281,167 files, 138 GB) at this rate: {1_281_167 / rate / 60:.0f} min here, "
              f"when the disk keeps up with {data_bytes / 1e6 / seconds['stallscope']:.0f} MB/s")


if __name__ == "__main__":
    main()
