"""Benchmark: a tf.data pipeline of your own over JPEGs in a bucket, read by TF's own gs:// against
`stallscope.read_files`, with the same pipeline on local disk as the baseline, in one run.

The pipeline is what a user writes: (path, label) pairs, a read, `decode_jpeg` + resize in a parallel
map (AUTOTUNE), batches of 32, prefetch. Only the read differs:
  local          tf.io.read_file in the map, from the local folder (the baseline)
  tf-gs          tf.io.read_file in the map, from gs:// through TF's client (a new TCP+TLS connection per
                 request), GCS_READ_CACHE_BLOCK_SIZE_MB=1 as stallscope sets it for JPEGs (TF's default
                 64 MB buffer per object costs ~46 ms of CPU per JPEG)
  tf-gs-16       the same, with 16 reads in flight the usual way (a parallel read map of 16 on a private
                 pool of 16 + cores)
  stallscope-gs  stallscope.read_files(dataset, in_flight=64) from gs:// (obstore, kept-alive connections)
  stallscope-s3  the same from s3:// (TF 2.21 cannot open s3:// at all)
and the same images as TFRecord shards (`stallscope convert`, 4 training shards), parsed then decoded:
  records-local / records-tf-gs   tf.data.TFRecordDataset(shards, num_parallel_reads=4)
  records-stallscope-gs / -s3     stallscope.read_records(shards, num_parallel_reads=4)
For the files variants read from a store, the storage what-if of `stallscope.diagnose` on the same
pipeline over the local copy predicts images/s at the latency (printed beside the measured figure).
Each variant runs in a fresh process (TF reads its gs:// settings when it loads), takes one pass over
the images as warm-up, then reads whole passes for at least `--seconds`. The stores are
`stallscope storage serve` at `--latency` on these same cores (a real store's CPU is elsewhere).

  python benchmarks/own_pipeline.py [--latency 10 --images-per-class 400 --seconds 6 --repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

VARIANTS = ("local", "tf-gs", "tf-gs-16", "stallscope-gs", "stallscope-s3",
            "records-local", "records-tf-gs", "records-stallscope-gs", "records-stallscope-s3")
SHARD_READS = 4
PREDICTED = ("tf-gs", "tf-gs-16", "stallscope-gs", "stallscope-s3")
BATCH = 32


def measure(variant: str, root: str, seconds: float) -> float:
    """Images/s of one variant's pipeline, in this (fresh) process."""
    import tensorflow as tf

    import stallscope

    if variant.startswith("records"):
        return measure_records(variant, root, seconds)
    files = stallscope.list_files(root, "*.jpg")
    return timed(files_pipeline(variant, files), len(files), seconds)


def files_pipeline(variant: str, files: list[str]):
    """The user's pipeline over `files` (path, label) -> batches of decoded images, read as `variant` reads."""
    import tensorflow as tf

    import stallscope

    names = sorted({f.split("/")[-2] for f in files})
    labels = [names.index(f.split("/")[-2]) for f in files]
    dataset = tf.data.Dataset.from_tensor_slices((files, labels)).repeat()

    def decode(jpeg, label):
        return tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (96, 96)), label

    if variant.startswith("stallscope"):
        dataset = stallscope.read_files(dataset, in_flight=64)
    elif variant == "tf-gs-16":
        dataset = dataset.map(lambda p, label: (tf.io.read_file(p), label), num_parallel_calls=16)
        options = tf.data.Options()
        options.threading.private_threadpool_size = 16 + (os.cpu_count() or 1)
        dataset = dataset.with_options(options)
    else:
        dataset = dataset.map(lambda p, label: (tf.io.read_file(p), label), num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE)


def predict(variant: str, local_root: str, latency_ms: float) -> float:
    """What `stallscope.diagnose(..., what_if_storage=...)` predicts for the variant's pipeline at this
    latency, run on the local copy as a user asks before moving the data: the row as configured."""
    import stallscope

    files = stallscope.list_files(local_root, "*.jpg")
    client = {"tf-gs": "tf-gcs", "tf-gs-16": "tf-gcs", "stallscope-gs": "obstore-gcs", "stallscope-s3": "obstore"}[variant]
    diagnosis = stallscope.diagnose(files_pipeline(variant, files), files=files, steps=20,
                                    accelerator="emulated:20000", what_if_storage=f"{latency_ms:g}ms,100Gbit",
                                    storage_client=client)
    row = diagnosis.storage_whatif.scenarios[0].format("files")
    return row.parallel.images_per_second


def measure_records(variant: str, root: str, seconds: float) -> float:
    """Images/s of the records pipeline: shards read, Examples parsed, JPEGs decoded and resized."""
    import tensorflow as tf

    import stallscope

    shards = stallscope.list_files(root, "train-*")
    if variant.endswith("local") or variant.endswith("tf-gs"):
        records = tf.data.TFRecordDataset(shards, num_parallel_reads=SHARD_READS)
    else:
        records = stallscope.read_records(shards, num_parallel_reads=SHARD_READS)
    count = sum(1 for _ in stallscope.read_records(shards))  # every training image: none was skipped
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

    def decode(record):
        example = tf.io.parse_single_example(record, features)
        image = tf.image.resize(tf.io.decode_jpeg(example["image/encoded"], channels=3), (96, 96))
        return image, example["image/class/label"]

    dataset = records.repeat().map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE)
    return timed(dataset, count, seconds)


def timed(dataset, count: int, seconds: float) -> float:
    """A pass of warm-up (connections, thread pools, page cache), then whole passes for `seconds`."""
    iterator = iter(dataset)
    for _ in range(-(-count // BATCH)):
        next(iterator)
    images, started = 0, time.perf_counter()
    while True:
        for _ in range(-(-count // BATCH)):
            next(iterator)
            images += BATCH
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return images / elapsed


def child(variant: str, root: str, env: dict[str, str], seconds: float, latency_ms: float,
          predict_from: str | None) -> dict:
    command = [sys.executable, __file__, "--child", variant, root, "--seconds", str(seconds), "--latency", str(latency_ms)]
    done = subprocess.run(command + (["--predict-from", predict_from] if predict_from else []),
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env})
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=10.0, help="per-request latency in ms")
    parser.add_argument("--images-per-class", type=int, default=400)
    parser.add_argument("--long-side", default="400-600", help="400-600: ~75 KB ImageNet-like JPEGs")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=1, help="runs per variant, in turn; medians reported")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "ROOT"), help=argparse.SUPPRESS)
    parser.add_argument("--predict-from", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = {"images_per_s": measure(args.child[0], args.child[1], args.seconds)}
        if args.predict_from:
            result["predicted"] = predict(args.child[0], args.predict_from, args.latency)
        print(json.dumps(result))
        return 0

    from stallscope.storage.emulator import emulate

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stallscope-bench-own-") as scratch:
        data = Path(scratch) / "files"
        subprocess.run([sys.executable, "-m", "stallscope", "prepare", "synthetic", "--output", str(data),
                        "--classes", "4", "--images-per-class", str(args.images_per_class), "--long-side",
                        args.long_side, "--workers", "2"], check=True, capture_output=True)
        count = sum(1 for _ in (data / "train").rglob("*.jpg"))
        subprocess.run([sys.executable, "-m", "stallscope", "convert", str(data), "--output-path",
                        str(Path(scratch) / "records"), "--train-shards", "4", "--validation-shards", "1",
                        "--no-progress"], check=True, capture_output=True)
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        latency = args.latency / 1000.0
        with emulate(scratch, kind="gcs", latency_s=latency, max_duration_s=3600) as gs, \
                emulate(scratch, kind="s3", latency_s=latency, max_duration_s=3600) as s3:
            gs_env = {**gs.env, "GCS_READ_CACHE_BLOCK_SIZE_MB": "1"}
            places = {"local": (str(data / "train"), {}), "tf-gs": (f"{gs.url}/files/train", gs_env),
                      "tf-gs-16": (f"{gs.url}/files/train", gs_env),
                      "stallscope-gs": (f"{gs.url}/files/train", gs_env),
                      "stallscope-s3": (f"{s3.url}/files/train", s3.env),
                      "records-local": (str(Path(scratch) / "records"), {}),
                      "records-tf-gs": (f"{gs.url}/records", gs.env),  # TF's default block: shards are streamed
                      "records-stallscope-gs": (f"{gs.url}/records", gs.env),
                      "records-stallscope-s3": (f"{s3.url}/records", s3.env)}
            predicted: dict[str, float] = {}
            for repeat in range(args.repeats):
                for variant in VARIANTS:
                    root, env = places[variant]
                    asks = repeat == 0 and variant in PREDICTED
                    got = child(variant, root, env, args.seconds, args.latency, str(data / "train") if asks else None)
                    rates[variant].append(got["images_per_s"])
                    if asks:
                        predicted[variant] = got["predicted"]
                    print(f"  {variant:22} {rates[variant][-1]:8,.0f} images/s", flush=True)
    medians = {v: statistics.median(r) for v, r in rates.items()}
    print(f"{count} training JPEGs, read + decode + resize to 96x96 in batches of {BATCH}, {args.latency:g} ms per "
          f"request, median of {args.repeats} run(s) each, {time.perf_counter() - started:.0f} s")
    print(f"{'variant':22} {'images/s':>9} {'vs local':>9} {'vs TF gs://':>12} {'predicted':>10} {'pred/meas':>10}")
    for variant in VARIANTS:
        base = "records-" if variant.startswith("records") else ""
        guess = f"{predicted[variant]:10,.0f} {predicted[variant] / medians[variant]:9.2f}x" if variant in predicted else ""
        print(f"{variant:22} {medians[variant]:9,.0f} {medians[variant] / medians[base + 'local']:8.2f}x "
              f"{medians[variant] / medians[base + 'tf-gs']:11.2f}x {guess}")
    print("predicted: stallscope.diagnose(pipeline on the local copy, what_if_storage=LATENCY,100Gbit), the row "
          "as configured; the store's own CPU on these cores is not in it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
