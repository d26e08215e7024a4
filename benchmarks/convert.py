"""Conversion throughput: stallscope convert vs the seed-002 converter vs a raw copy, in one run.

Builds the built-in data set (`stallscope.data.synthetic`), then times each variant in a fresh child
process (so one variant's imports, TensorFlow's thread pools or page cache state cannot help or hurt
another), `--repeats` times, and prints the median images/s and MB/s (of input JPEG bytes) with
ratios against the seed's way and against the raw copy.

Variants:
  stallscope       convert_tree as `stallscope convert` runs it: every image sniffed, every JPEG's
                   whole compressed stream decoded (pixels rebuilt at 1/8 scale), parallel workers
  stallscope-full  the same with `--check full`: every pixel of every image decoded
  seed-002         the blog's loop: one thread, tf.io.read_file per image, tf.train.Example, no checks
  copy             shutil.copyfile of every file: the I/O limit
  stream-only      Pillow decoding every file's compressed stream at 1/8 scale in the same worker
                   count, nothing written: the ceiling for a converter that checks every stream
  decode-only      Pillow's full decode of every file, likewise: the ceiling for a converter that
                   decodes every pixel

Page cache: `--cache cold` (default) evicts every input file with posix_fadvise(DONTNEED) before
each timed run; `--cache warm` reads every file once before each timed run instead.

  python benchmarks/convert.py [--classes 10 --images-per-class 100 --workers N --cache cold|warm]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from stallscope.config import usable_cores  # noqa: E402  (after the log level, which the package also sets)
from stallscope.records.convert import default_workers  # noqa: E402

VARIANTS = ("stallscope", "stallscope-full", "seed-002", "copy", "stream-only", "decode-only")


def input_files(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*.jpg") if p.is_file())


def evict(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(files: list[Path]) -> None:
    for path in files:
        path.read_bytes()


# --- the variants, each run in its own child process ---------------------------------------------


def run_stallscope(src: Path, out: Path, workers: int, check: str = "stream") -> None:
    from stallscope.records.convert import ConvertOptions, convert_tree

    convert_tree(ConvertOptions(src, out, workers=workers, check=check))


def run_stallscope_full(src: Path, out: Path, workers: int) -> None:
    run_stallscope(src, out, workers, check="full")


def run_seed(src: Path, out: Path, workers: int) -> None:
    """seed-002's `create_tfrecord`, line for line, run once per split folder (it expects `{label}/*`)."""
    import tensorflow as tf

    messages = []  # the seed prints one line per file; kept, not printed, so the terminal is not timed
    for split in sorted(os.listdir(src)):
        dataset_path = os.path.join(src, split)
        if not os.path.isdir(dataset_path):
            continue
        settings = {"dataset_path": dataset_path, "size_per_record": 52428800, "output_path": str(out / split)}
        if not os.path.isdir(settings["output_path"]):
            os.makedirs(settings["output_path"], mode=0o777)
        output_file_prefix = settings["output_path"] + "/out_"
        category_index = 0
        sample_counter = 0
        sample_size = 0
        output_counter = 0
        writer = tf.io.TFRecordWriter(output_file_prefix + str(output_counter) + ".tfrecord")
        for category in os.listdir(settings["dataset_path"]):
            category_dir = os.path.join(settings["dataset_path"], category)
            image_filenames = os.listdir(category_dir)
            for image_filename in image_filenames:
                image_path = os.path.join(category_dir, image_filename)
                image = tf.io.read_file(image_path)
                sample_counter += 1
                sample_size += os.path.getsize(image_path)
                example = tf.train.Example(features=tf.train.Features(feature={
                    "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_filename.encode("utf-8")])),
                    "category": tf.train.Feature(int64_list=tf.train.Int64List(value=[category_index])),
                    "data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.numpy()])),
                }))
                writer.write(example.SerializeToString())
                if sample_size >= settings["size_per_record"]:
                    writer.close()
                    messages.append(f"{output_file_prefix}{output_counter}.tfrecord ({sample_counter} samples)")
                    output_counter += 1
                    sample_counter = 0
                    sample_size = 0
                    writer = tf.io.TFRecordWriter(output_file_prefix + str(output_counter) + ".tfrecord")
            category_index += 1
        if sample_counter != 0:
            writer.close()
            messages.append(f"{output_file_prefix}{output_counter}.tfrecord ({sample_counter} samples)")


def run_copy(src: Path, out: Path, workers: int) -> None:
    for path in input_files(src):
        target = out / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _decode_files(paths: list[str], scaled: bool = False) -> int:
    from PIL import Image

    for path in paths:
        with open(path, "rb") as handle:
            image = Image.open(io.BytesIO(handle.read()))
            if scaled:
                image.draft("RGB", (1, 1))
            image.load()
    return len(paths)


def _stream_files(paths: list[str]) -> int:
    return _decode_files(paths, scaled=True)


def _decode_in_workers(src: Path, workers: int, decode) -> None:
    import concurrent.futures

    paths = [str(p) for p in input_files(src)]
    chunks = [paths[i:i + 8] for i in range(0, len(paths), 8)]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        sum(pool.map(decode, chunks))


def run_decode_only(src: Path, out: Path, workers: int) -> None:
    _decode_in_workers(src, workers, _decode_files)


def run_stream_only(src: Path, out: Path, workers: int) -> None:
    _decode_in_workers(src, workers, _stream_files)


RUNNERS = {"stallscope": run_stallscope, "stallscope-full": run_stallscope_full, "seed-002": run_seed,
           "copy": run_copy, "stream-only": run_stream_only, "decode-only": run_decode_only}


def child(args: argparse.Namespace) -> None:
    """Times one variant once; the imports it needs are done before the clock starts."""
    src, out = Path(args.src), Path(args.out)
    if args.variant == "seed-002":
        import tensorflow  # noqa: F401  (start-up is not the seed's per-image cost)
    elif args.variant.startswith("stallscope"):
        import stallscope.records.convert  # noqa: F401
    files = input_files(src)
    if args.cache == "cold":
        evict(files)
    else:
        warm(files)
    started = time.perf_counter()
    RUNNERS[args.variant](src, out, args.workers)
    elapsed = time.perf_counter() - started
    print(json.dumps({"seconds": elapsed}))


# --- the parent: data set, repeats, table -------------------------------------------------------


def build_dataset(root: Path, classes: int, per_class: int) -> Path:
    try:
        from stallscope.data.synthetic import SyntheticOptions, make_synthetic
    except ImportError:  # pragma: no cover - the built-in data set is part of the package
        sys.exit("benchmarks/convert.py needs stallscope.data.synthetic (the built-in data set)")
    make_synthetic(root, SyntheticOptions(classes=classes, images_per_class=per_class, seed=0))
    return root


def time_variant(variant: str, src: Path, work: Path, workers: int, cache: str) -> float:
    out = work / variant
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--child", variant, "--src", str(src), "--out", str(out),
           "--workers", str(workers), "--cache", cache]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"{variant} failed:\n{result.stderr}")
    seconds = json.loads(result.stdout.strip().splitlines()[-1])["seconds"]
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--images-per-class", type=int, default=100)
    parser.add_argument("--workers", type=int, default=default_workers(),
                        help="workers of every parallel variant (default: the converter's own default, cores + 1)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", choices=("cold", "warm"), default="cold")
    parser.add_argument("--work", default="bench-output/convert", help="scratch directory")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", choices=VARIANTS, dest="variant", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        child(args)
        return

    work = Path(args.work)
    src = build_dataset(work / f"dataset-{args.classes}x{args.images_per_class}", args.classes, args.images_per_class)
    files = input_files(src)
    n_images, n_bytes = len(files), sum(p.stat().st_size for p in files)
    print(f"data set: {n_images} JPEGs, {n_bytes / 1e6:.1f} MB (mean {n_bytes / n_images / 1e3:.0f} KB), "
          f"{args.workers} worker(s), {usable_cores()} core(s), page cache {args.cache}, median of {args.repeats}")
    variants = [v for v in args.variants.split(",") if v]
    medians = {}
    for variant in variants:
        times = [time_variant(variant, src, work, args.workers, args.cache) for _ in range(args.repeats)]
        medians[variant] = statistics.median(times)
    print(f"{'variant':<16} {'images/s':>10} {'MB/s':>8} {'vs seed-002':>12} {'vs copy':>8}")
    for variant in variants:
        seconds = medians[variant]
        vs_seed = medians["seed-002"] / seconds if "seed-002" in medians else float("nan")
        vs_copy = medians["copy"] / seconds if "copy" in medians else float("nan")
        print(f"{variant:<16} {n_images / seconds:>10.0f} {n_bytes / 1e6 / seconds:>8.1f} {vs_seed:>11.2f}x {vs_copy:>7.2f}x")
    for ours, ceiling in (("stallscope", "stream-only"), ("stallscope-full", "decode-only")):
        if ours in medians and ceiling in medians:
            print(f"{ours} / {ceiling} (its decode ceiling): {medians[ceiling] / medians[ours]:.2f}x")
    if "stallscope" in medians and "seed-002" in medians:
        ratio = medians["seed-002"] / medians["stallscope"]
        print(f"stallscope / seed-002 throughput: {ratio:.2f}x (target >= 1.5x)")
    for ceiling in ("stream-only", "decode-only"):
        if ceiling in medians and "seed-002" in medians:
            print(f"  {ceiling} alone, nothing else done, reaches {medians['seed-002'] / medians[ceiling]:.2f}x seed-002 "
                  f"with {args.workers} worker(s): the most any converter that decodes that much can reach here")


if __name__ == "__main__":
    main()
