"""Conversion throughput, marginal images/s: stallscope convert vs the seed-003 way vs seed-002 vs the
stream-decode ceiling, in one run, same cores, same data.

Builds the built-in data set (`stallscope.data.synthetic`) twice, with N and 2N images (`--images-per-class`
and twice that), times every variant on both in a fresh child process (so one variant's imports,
TensorFlow's thread pools or page cache state cannot help or hurt another), `--repeats` times, and
reports the marginal rate N / (time at 2N - time at N), each the fastest of the repeats (the least
disturbed on a shared machine): start-up (process pools, TensorFlow's first op) cancels out. The
marginal CPU time per image (user + system of the child and its workers, median of the repeats) is
shown beside it, and the ratios by both. Each ratio is also taken repeat by repeat (every repeat runs
every variant at N and 2N in turn) and given as the median and range of those: how far a single run's
ratio moves on this machine. Every sharded variant writes `--shards` shards per split.

Variants:
  stallscope       convert_tree as `stallscope convert` runs it: every image sniffed, every JPEG's
                   whole compressed stream decoded (pixels rebuilt at 1/8 scale), workers writing shards
  seed-003         tensorflow/models' build_image_data.py way (seed-003), re-implemented here for TF 2:
                   a coordinator splits the files into `--workers` ranges, one thread per range owns
                   shards/threads shards, reads each file, decodes it with TF (tf.image.decode_jpeg,
                   eager, shared by the threads) to check it and get its size, and writes a
                   tf.train.Example with the same features as the original through tf.io.TFRecordWriter
  seed-002         the blog's loop: one thread, tf.io.read_file per image, tf.train.Example, no checks
  stream-only      libjpeg-turbo decoding every file's compressed stream with stallscope's own call
                   (`images.libjpeg_verdict`: pixels rebuilt in grey at 1/8 scale) in `--workers`
                   processes, nothing written: the ceiling for a converter that checks every stream
  stream-write     stream-only plus what any converter must do with the bytes it keeps: each of
                   `--shards` files written by one task, every image's bytes hashed (sha256) and
                   written, its write-back started every 8 MB and the file fsync'd (as stallscope's
                   shards are): the ceiling for a converter that checks and writes
  (optional, with --variants) stallscope-full (`--check full`), decode-only (the same call's full RGB
  decode: its ceiling), stream-pillow (the stream decode through Pillow, `draft("L")` and `load()`, the
  way stallscope checked before it called libjpeg-turbo directly), copy (shutil.copyfile of every
  file: the I/O limit)

A second table splits each variant's marginal CPU per image between the parent process and its workers,
with the minor page faults and voluntary and involuntary context switches per image: where a variant's
CPU per image grows with the cores (memory faulted in, waits, preemption), it shows which.

Page cache: `--cache warm` (default) reads every file once before each timed run; `--cache cold` evicts
every input file with posix_fadvise(DONTNEED) instead.

  python benchmarks/convert.py [--classes 10 --images-per-class 100 --workers N --shards S --repeats 3 --cache warm|cold]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from stallscope.config import usable_cores  # noqa: E402  (after the log level, which the package also sets)
from stallscope.records.convert import default_workers  # noqa: E402

VARIANTS = ("stallscope", "seed-003", "seed-002", "stream-only", "stream-write", "stallscope-full", "decode-only",
            "stream-pillow", "copy")
DEFAULT_VARIANTS = VARIANTS[:5]
MIN_MARGINAL_S = 2.0  # below this, a variant's marginal time (2N minus N) is too short to compare


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


def run_stallscope(src: Path, out: Path, workers: int, shards: int, check: str = "stream") -> None:
    from stallscope.records.convert import ConvertOptions, convert_tree

    convert_tree(ConvertOptions(src, out, workers=workers, shards=shards, check=check))


def run_stallscope_full(src: Path, out: Path, workers: int, shards: int) -> None:
    run_stallscope(src, out, workers, shards, check="full")


def run_seed003(src: Path, out: Path, workers: int, shards: int) -> None:
    """build_image_data.py's way, per split: list `{label}/*` files, shuffle them (seed 12345), cut
    them into one range per thread, and let each thread own `shards / threads` whole shards."""
    import random
    import threading

    import numpy as np
    import tensorflow as tf

    class ImageCoder:
        """The original's one shared decoder (a tf.Session there; eager ops here, which release the GIL
        as session.run does, and were faster than a shared tf.function on this data)."""

        def png_to_jpeg(self, data: bytes) -> bytes:
            return tf.io.encode_jpeg(tf.io.decode_png(data, channels=3), format="rgb", quality=100).numpy()

        def decode_jpeg(self, data: bytes) -> np.ndarray:
            image = tf.io.decode_jpeg(data, channels=3)
            assert len(image.shape) == 3 and image.shape[2] == 3
            return image

    def bytes_feature(value: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def int64_feature(value: int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    def to_example(filename: str, buffer: bytes, label: int, text: str, height: int, width: int):
        return tf.train.Example(features=tf.train.Features(feature={
            "image/height": int64_feature(height),
            "image/width": int64_feature(width),
            "image/colorspace": bytes_feature(b"RGB"),
            "image/channels": int64_feature(3),
            "image/class/label": int64_feature(label),
            "image/class/text": bytes_feature(text.encode()),
            "image/format": bytes_feature(b"JPEG"),
            "image/filename": bytes_feature(os.path.basename(filename).encode()),
            "image/encoded": bytes_feature(buffer),
        }))

    def process_image(filename: str, coder: ImageCoder) -> tuple[bytes, int, int]:
        with tf.io.gfile.GFile(filename, "rb") as handle:
            data = handle.read()
        if filename.lower().endswith(".png"):
            data = coder.png_to_jpeg(data)
        image = coder.decode_jpeg(data)
        return data, int(image.shape[0]), int(image.shape[1])

    def thread_batch(coder, thread_index, ranges, name, filenames, texts, labels, num_shards) -> None:
        num_threads = len(ranges)
        per_thread = num_shards // num_threads
        shard_ranges = np.linspace(ranges[thread_index][0], ranges[thread_index][1], per_thread + 1).astype(int)
        for s in range(per_thread):
            shard = thread_index * per_thread + s
            with tf.io.TFRecordWriter(str(out / f"{name}-{shard:05d}-of-{num_shards:05d}")) as writer:
                for i in range(shard_ranges[s], shard_ranges[s + 1]):
                    buffer, height, width = process_image(filenames[i], coder)
                    writer.write(to_example(filenames[i], buffer, labels[i], texts[i], height, width).SerializeToString())

    def process_split(name: str, directory: Path, num_shards: int, num_threads: int) -> None:
        assert not num_shards % num_threads, "build_image_data needs shards to be a multiple of threads"
        classes = sorted(p.name for p in directory.iterdir() if p.is_dir())
        filenames, texts, labels = [], [], []
        for label, text in enumerate(classes, start=1):  # the original's labels start at 1 (0: background)
            matches = tf.io.gfile.glob(f"{directory}/{text}/*")
            filenames += matches
            texts += [text] * len(matches)
            labels += [label] * len(matches)
        order = list(range(len(filenames)))
        random.seed(12345)
        random.shuffle(order)
        filenames, texts, labels = ([x[i] for i in order] for x in (filenames, texts, labels))
        spacing = np.linspace(0, len(filenames), num_threads + 1).astype(int)
        ranges = [[spacing[i], spacing[i + 1]] for i in range(num_threads)]
        coder = ImageCoder()
        threads = [threading.Thread(target=thread_batch, args=(coder, t, ranges, name, filenames, texts, labels, num_shards))
                   for t in range(num_threads)]
        for thread in threads:
            thread.start()
        for thread in threads:  # the original's tf.train.Coordinator.join
            thread.join()

    for split in sorted(p.name for p in src.iterdir() if p.is_dir()):
        process_split(split, src / split, shards, workers)


def run_seed(src: Path, out: Path, workers: int, shards: int) -> None:
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


def run_copy(src: Path, out: Path, workers: int, shards: int) -> None:
    for path in input_files(src):
        target = out / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _decode_files(paths: list[str], scaled: bool = False) -> int:
    from stallscope.data.images import libjpeg_verdict

    for path in paths:
        with open(path, "rb") as handle:
            libjpeg_verdict(handle.read(), scaled=scaled)  # stallscope's own decode call
    return len(paths)


def _stream_files(paths: list[str]) -> int:
    return _decode_files(paths, scaled=True)


def _stream_files_pillow(paths: list[str]) -> int:
    from PIL import Image

    for path in paths:
        with open(path, "rb") as handle:
            image = Image.open(io.BytesIO(handle.read()))
            image.draft("L", (1, 1))  # grey, 1/8 scale
            image.load()
    return len(paths)


def _decode_in_workers(src: Path, workers: int, decode) -> None:
    import concurrent.futures

    paths = [str(p) for p in input_files(src)]
    chunks = [paths[i:i + 8] for i in range(0, len(paths), 8)]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        sum(pool.map(decode, chunks))


def _stream_and_write(job: tuple[list[str], str]) -> int:
    import hashlib

    from stallscope.data.images import libjpeg_verdict
    from stallscope.records.writeback import WRITEBACK_BYTES, start_writeback

    paths, target = job
    sha = hashlib.sha256()
    written = written_back = 0
    with open(target, "wb", buffering=1 << 20) as sink:
        for path in paths:
            with open(path, "rb") as handle:
                data = handle.read()
            libjpeg_verdict(data)  # as stallscope's stream check: grey, 1/8 scale
            sha.update(data)
            sink.write(data)
            written += len(data)
            if written - written_back >= WRITEBACK_BYTES:  # as stallscope's shards: the fsync waits for a tail
                sink.flush()
                start_writeback(sink.fileno(), written_back, written - written_back)
                written_back = written
        sink.flush()
        os.fsync(sink.fileno())
    return len(paths)


def run_stream_write(src: Path, out: Path, workers: int, shards: int) -> None:
    import concurrent.futures

    paths = [str(p) for p in input_files(src)]
    step = -(-len(paths) // shards)
    jobs = [(paths[i:i + step], str(out / f"part-{i // step:05d}")) for i in range(0, len(paths), step)]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        sum(pool.map(_stream_and_write, jobs))


def run_decode_only(src: Path, out: Path, workers: int, shards: int) -> None:
    _decode_in_workers(src, workers, _decode_files)


def run_stream_only(src: Path, out: Path, workers: int, shards: int) -> None:
    _decode_in_workers(src, workers, _stream_files)


def run_stream_pillow(src: Path, out: Path, workers: int, shards: int) -> None:
    _decode_in_workers(src, workers, _stream_files_pillow)


RUNNERS = {"stallscope": run_stallscope, "stallscope-full": run_stallscope_full, "seed-003": run_seed003,
           "seed-002": run_seed, "copy": run_copy, "stream-only": run_stream_only, "stream-write": run_stream_write,
           "decode-only": run_decode_only, "stream-pillow": run_stream_pillow}


def child(args: argparse.Namespace) -> None:
    """Times one variant once; the imports it needs are done before the clock starts."""
    src, out = Path(args.src), Path(args.out)
    if args.variant.startswith("seed-"):
        import tensorflow  # noqa: F401  (start-up is not the seeds' per-image cost)
    elif args.variant.startswith("stallscope"):
        import stallscope.records.convert  # noqa: F401
    files = input_files(src)
    if args.cache == "cold":
        evict(files)
    else:
        warm(files)
    cpu_before, usage_before = _cpu_seconds(), _usage()
    started = time.perf_counter()
    RUNNERS[args.variant](src, out, args.workers, args.shards)
    elapsed = time.perf_counter() - started
    usage = {name: value - usage_before[name] for name, value in _usage().items()}
    print(json.dumps({"seconds": elapsed, "cpu": _cpu_seconds() - cpu_before, "usage": usage}))


USAGE = ("parent_cpu", "workers_cpu", "minor_faults", "voluntary_switches", "involuntary_switches")


def _usage() -> dict[str, float]:
    """Where a run's CPU goes: this process's CPU against its ended workers', and the page faults and
    context switches of both (a worker that faults in more memory, or waits or is preempted more, per
    image shows it here)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"parent_cpu": own.ru_utime + own.ru_stime, "workers_cpu": children.ru_utime + children.ru_stime,
            "minor_faults": own.ru_minflt + children.ru_minflt, "voluntary_switches": own.ru_nvcsw + children.ru_nvcsw,
            "involuntary_switches": own.ru_nivcsw + children.ru_nivcsw}


def _cpu_seconds() -> float:
    """User + system CPU of this process (all its threads) and of its children that have ended (every
    variant's worker processes are joined before it returns)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# --- the parent: data set, repeats, table -------------------------------------------------------


def build_dataset(root: Path, classes: int, per_class: int) -> Path:
    try:
        from stallscope.data.synthetic import SyntheticOptions, make_synthetic
    except ImportError:  # pragma: no cover - the built-in data set is part of the package
        sys.exit("benchmarks/convert.py needs stallscope.data.synthetic (the built-in data set)")
    make_synthetic(root, SyntheticOptions(classes=classes, images_per_class=per_class, seed=0))
    return root


def time_variant(variant: str, src: Path, work: Path, args: argparse.Namespace) -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds, `_usage` differences) of one run of `variant` on `src`, in a fresh
    child process."""
    out = work / variant
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--child", variant, "--src", str(src), "--out", str(out),
           "--workers", str(args.workers), "--shards", str(args.shards), "--cache", args.cache]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"{variant} failed:\n{result.stderr}")
    timing = json.loads(result.stdout.strip().splitlines()[-1])
    shutil.rmtree(out, ignore_errors=True)
    return timing["seconds"], timing["cpu"], timing["usage"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--images-per-class", type=int, default=100, help="N's images per class (2N: twice as many)")
    parser.add_argument("--workers", type=int, default=default_workers(),
                        help="processes (threads for seed-003) of every parallel variant (default: the converter's own, cores + 1)")
    parser.add_argument("--shards", type=int, default=None, help="shards per split (default: 4 x workers)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", choices=("cold", "warm"), default="warm")
    parser.add_argument("--work", default="bench-output/convert", help="scratch directory")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"any of {', '.join(VARIANTS)}")
    parser.add_argument("--child", choices=VARIANTS, dest="variant", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.shards is None:
        args.shards = 4 * args.workers
    if args.variant:
        child(args)
        return

    work = Path(args.work)
    per_class = (args.images_per_class, 2 * args.images_per_class)
    sources = [build_dataset(work / f"dataset-{args.classes}x{n}", args.classes, n) for n in per_class]
    sizes = []
    for src in sources:
        files = input_files(src)
        sizes.append((len(files), sum(p.stat().st_size for p in files)))
    (n1, b1), (n2, b2) = sizes
    print(f"data sets: {n1} and {n2} JPEGs ({b1 / 1e6:.1f} and {b2 / 1e6:.1f} MB, mean {b2 / n2 / 1e3:.0f} KB), "
          f"{args.shards} shards per split, {args.workers} worker(s), {usable_cores()} core(s), page cache {args.cache}, "
          f"fastest of {args.repeats} (CPU: median)")
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        sys.exit(f"--variants: unknown {unknown[0]!r}; expected any of {', '.join(VARIANTS)}")
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {(v, i): [] for v in variants for i in (0, 1)}
    usages: dict[tuple[str, int], list[dict]] = {(v, i): [] for v in variants for i in (0, 1)}
    for _ in range(args.repeats):  # every variant at N and 2N within each repeat: a change in load hits all alike
        for variant in variants:
            for index, src in enumerate(sources):
                wall, cpu, usage = time_variant(variant, src, work, args)
                runs[variant, index].append((wall, cpu))
                usages[variant, index].append(usage)
    rates, cpu_ms = {}, {}
    short: dict[str, float] = {}  # variants whose marginal time is too short to compare
    print(f"{'variant':<16} {'N: s':>7} {'2N: s':>7} {'marginal images/s':>18} {'MB/s':>7} {'CPU ms/image':>13}")
    for variant in variants:
        # The fastest run of each size: on a shared machine the least disturbed run is the closest to
        # the code's own cost; CPU time, much less sensitive to other load, is shown beside it.
        t1, t2 = (min(wall for wall, _ in runs[variant, i]) for i in (0, 1))
        c1, c2 = (statistics.median(cpu for _, cpu in runs[variant, i]) for i in (0, 1))
        extra = t2 - t1
        rates[variant] = (n2 - n1) / extra if extra > 0 else float("nan")
        cpu_ms[variant] = (c2 - c1) / (n2 - n1) * 1e3
        mb = (b2 - b1) / 1e6 / extra if extra > 0 else float("nan")
        print(f"{variant:<16} {t1:>7.2f} {t2:>7.2f} {rates[variant]:>18.0f} {mb:>7.1f} {cpu_ms[variant]:>13.2f}")
        if extra < MIN_MARGINAL_S:
            short[variant] = extra
    if short:
        # The marginal time is the difference of two runs; where it is a fraction of a second, a worker
        # started late or a tail of one slow shard moves a ratio by tens of percent (16 cores, 600 a class:
        # 0.5 s, ratios by repeat from 0.61x to 0.99x). `copy` decodes nothing and is always quick.
        decoding = [t for v, t in short.items() if v not in ("copy", "seed-002")]  # those two decode nothing
        shortest = min(decoding or short.values())
        named = ", ".join(f"{v} {t:.2f} s" for v, t in short.items())
        print(f"note: marginal times under {MIN_MARGINAL_S:g} s ({named}): ratios with these move with start-up and "
              f"tail noise; --images-per-class {math.ceil(args.images_per_class * MIN_MARGINAL_S / max(shortest, 1e-3)):,} "
              "would give runs this machine can time")

    # Where each image's CPU goes, marginal (2N minus N, medians of the repeats): the parent's share (listing,
    # planning, handing out tasks), the workers', and the faults and switches that grow with contention.
    print(f"{'per image':<16} {'parent us':>10} {'workers ms':>11} {'minor faults':>13} {'vol. switches':>14} "
          f"{'invol. switches':>16}")
    for variant in variants:
        per_image = {name: (statistics.median(u[name] for u in usages[variant, 1])
                            - statistics.median(u[name] for u in usages[variant, 0])) / (n2 - n1) for name in USAGE}
        print(f"{variant:<16} {per_image['parent_cpu'] * 1e6:>10.1f} {per_image['workers_cpu'] * 1e3:>11.3f} "
              f"{per_image['minor_faults']:>13.1f} {per_image['voluntary_switches']:>14.2f} "
              f"{per_image['involuntary_switches']:>16.2f}")

    def per_repeat(variant: str) -> list[float]:
        """The marginal rate of each repeat on its own (its N and 2N runs ran back to back)."""
        return [(n2 - n1) / (big[0] - small[0]) if big[0] > small[0] else float("nan")
                for small, big in zip(runs[variant, 0], runs[variant, 1])]

    def ratio(ours: str, theirs: str, target: str = "") -> None:
        if ours in rates and theirs in rates:
            # Paired by repeat: both variants ran within minutes of each other, so a spell of load
            # elsewhere on the machine moves both; the spread says how far one run's ratio can be trusted.
            paired = sorted(a / b for a, b in zip(per_repeat(ours), per_repeat(theirs)))
            spread = (f"; by repeat {statistics.median(paired):.2f}x median ({paired[0]:.2f}-{paired[-1]:.2f}x)"
                      if len(paired) > 1 else "")
            print(f"{ours} / {theirs}: {rates[ours] / rates[theirs]:.2f}x images/s{target}{spread}; "
                  f"{cpu_ms[theirs] / cpu_ms[ours]:.2f}x by CPU time per image")

    ratio("stallscope", "seed-003", " (target >= 1.5x)")
    ratio("stallscope", "stream-only", " (its stream-decode ceiling; target >= 0.9x)")
    ratio("stallscope", "stream-write", " (its stream-decode-and-write ceiling)")
    # The most any converter that checks every stream can reach against seed-003 here: if the ceilings
    # themselves are below 1.5x, that target is out of reach for a converter that checks and writes.
    ratio("stream-only", "seed-003", " (checking every stream, writing nothing)")
    ratio("stream-write", "seed-003", " (checking every stream and writing the shards)")
    ratio("stream-only", "stream-pillow", " (libjpeg-turbo called directly vs through Pillow)")
    ratio("stallscope", "seed-002", " (seed-002 decodes nothing)")
    ratio("stallscope-full", "decode-only", " (its full-decode ceiling)")
    ratio("stallscope", "copy", " (the I/O limit)")


if __name__ == "__main__":
    main()
