"""Training from an ImageNet-sized JPEG tree: the time and memory before the first batch, against
Keras' own `image_dataset_from_directory` and a bare listing, in one run, on the same tree.

Builds a `{class}/{file}` tree (ImageNet train's shape by default: 1,000 classes, 1,281,167 files,
each a hard link of one valid 32x32 JPEG, so that a batch can be decoded), then runs each way in a
fresh child process, TensorFlow and Keras imported before the clock starts:

  listing      os.walk of the tree, one stat a file (its size), a path string and a label kept per
               file: the least any trainer that reports its data's bytes must do (the floor)
  keras        keras.utils.image_dataset_from_directory(tree, image_size, batch_size, seed) and its
               first batch: the way a Keras user trains from folders
  stallscope   what `stallscope train --source files` does before its first step: open_source (the
               scan, a stat a file) and the tuned pipeline's first batch (every file's path shuffled
               each epoch, decoded and resized)

Prints each way's seconds to the first batch and the child's peak RSS, and stallscope's ratios to
the others. With `--store gcs|s3` the same tree is also served as a bucket by the storage emulator
(`stallscope storage serve`, on loopback, on the same cores) and stallscope's way runs from it too: its
listing page by page, each image sized from the listing, its first batch fetched by stallscope's reader.
The tree is made in a temporary folder under `--work` (default /dev/shm where it exists:
a million files are made there in about 15 s) and removed at the end.

  python benchmarks/source_scale.py [--files 1281167 --classes 1000 --repeats 3 --store gcs|s3 --latency-ms 0]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_scale import IMAGENET_TRAIN_FILES, make_tree, tiny_jpeg  # noqa: E402

WAYS = ("listing", "keras", "stallscope")
IMAGE_SIZE = 64
BATCH = 32


def _listing(tree: str) -> int:
    paths, labels, total = [], [], 0
    for label, folder in enumerate(sorted(os.scandir(tree), key=lambda e: e.name)):
        for top, dirs, files in os.walk(folder.path):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(top, name)
                total += os.stat(path).st_size
                paths.append(path)
                labels.append(label)
    return len(paths)


def _keras(tree: str) -> int:
    import keras

    dataset = keras.utils.image_dataset_from_directory(tree, image_size=(IMAGE_SIZE, IMAGE_SIZE), batch_size=BATCH, seed=0)
    images, _ = next(iter(dataset))
    return int(images.shape[0])


def _stallscope(tree: str) -> int:
    from stallscope.pipeline.builder import build_dataset
    from stallscope.pipeline.presets import PRESETS
    from stallscope.pipeline.sources import open_source

    source = open_source("files", tree)
    dataset = build_dataset(PRESETS["tuned"].replace(image_size=IMAGE_SIZE, batch_size=BATCH), source)
    images, _ = next(iter(dataset))
    return int(images.shape[0])


def child(way: str, tree: str) -> None:
    """Times one way once in this fresh process; prints one JSON line with its peak RSS, and the RSS it
    had before the clock started (the same imports for every way)."""
    import keras  # noqa: F401  (imports are not what is compared)
    import tensorflow  # noqa: F401

    import stallscope.pipeline.builder  # noqa: F401

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    started = time.perf_counter()
    count = {"listing": _listing, "keras": _keras, "stallscope": _stallscope}[way](tree)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "count": count, "peak": peak, "before": before}))


def run_child(way: str, tree: str, env: dict[str, str] | None = None) -> dict:
    result = subprocess.run([sys.executable, __file__, "--child", way, tree], capture_output=True, text=True, check=False,
                            env={**os.environ, **env} if env else None)
    if result.returncode != 0:
        sys.exit(f"{way} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _timed(ways: list[tuple[str, str, str]], repeats: int, env: dict[str, str] | None) -> dict[str, list[dict]]:
    """Every (label, way, tree) run `repeats` times, the ways in turn within each repeat."""
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in ways}
    for _ in range(repeats):
        for label, way, tree in ways:
            runs[label].append(run_child(way, tree, env if tree.startswith(("gs://", "s3://")) else None))
    return runs


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=IMAGENET_TRAIN_FILES)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way, in turn; the median is shown")
    parser.add_argument("--store", choices=("gcs", "s3"), default=None,
                        help="also stallscope's way from the tree served as a bucket by the storage emulator")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="--store: the emulated store's latency per request")
    parser.add_argument("--work", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where the temporary folder is made (default: /dev/shm, else the system's)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="source-scale-", dir=args.work))
    try:
        image, tree = work / "tiny.jpg", work / "train"
        tiny_jpeg(image)
        started = time.perf_counter()
        make_tree(tree, args.files, args.classes, content=image)
        print(f"made {args.files:,} files (hard links of one 32x32 JPEG) in {args.classes:,} class folders "
              f"in {time.perf_counter() - started:.1f} s; median of {args.repeats} runs each, in turn")
        ways = [(way, way, str(tree)) for way in WAYS]
        with contextlib.ExitStack() as stack:
            env = None
            if args.store:
                from stallscope.storage.emulator import emulate

                # Only the tree is served: the bucket's listing holds the images and nothing else.
                store = stack.enter_context(emulate(tree, kind=args.store, latency_s=args.latency_ms / 1000,
                                                    max_duration_s=3600))
                print(f"served as {store.url} (emulated, {args.latency_ms:g} ms a request, on the same cores)")
                ways.append((f"stallscope {store.url.split(':')[0]}://", "stallscope", store.url))
                env = store.env
            runs = _timed(ways, args.repeats, env)
        seconds = {label: statistics.median(r["seconds"] for r in runs[label]) for label in runs}
        print(f"{'way':<16} {'s to 1st batch':>15} {'peak RSS MiB':>13} {'added MiB':>10} {'bytes a file':>13}")
        for label in runs:
            peak = statistics.median(r["peak"] for r in runs[label])
            added = statistics.median(r["peak"] - r["before"] for r in runs[label])
            print(f"{label:<16} {seconds[label]:>15.1f} {peak / 2**20:>13.0f} {added / 2**20:>10.0f} {added / args.files:>13.0f}")
        for other in ("keras", "listing"):
            print(f"stallscope / {other}: {seconds[other] / seconds['stallscope']:.2f}x as fast to the first batch")
        for label in runs:
            if label.startswith("stallscope "):
                print(f"{label} / stallscope from the local tree: {seconds['stallscope'] / seconds[label]:.2f}x as fast")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
