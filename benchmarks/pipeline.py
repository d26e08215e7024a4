"""Input pipeline throughput: the seeds' pipeline against the tf.data guide's and ours.

In one run over the same built-in data set (photo-like JPEGs of about 500x375), measures images/s of
  seed        the seeds' pipeline (sequential map, no prefetch, shuffle of decoded images), files
  autotune    the tf.data guide's advice with AUTOTUNE, files
  tuned       our preset, from files and from TFRecords
  tuned-256   our preset over TFRecords converted with max side 256
  decode      the decode limit: decode + resize alone over in-memory bytes, on all cores
and prints a table with ratios against `seed` and against the decode limit.

Every measurement reads every file once (the page cache is warm for all; the data set fits in
memory) and consumes the pipeline as the training loop does: one iterator over a repeating
dataset, one untimed epoch (tracing, first fills), then whole epochs' worth of batches timed, so the
seed pipeline's shuffle-buffer refill at each epoch counts as it does in training. The pipelines take turns over several
rounds and the best round counts. CPU ms per image (all threads) is printed beside images/s: it
hardly moves when other processes share the cores, while images/s does.

    python benchmarks/pipeline.py [--out DIR] [--images-per-class 50] [--epochs 2] [--rounds 3] [--explore]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stallscope.tfimport import import_tensorflow  # noqa: E402

tf = import_tensorflow()  # quietly, also in the converter's spawned workers that re-import this file

from stallscope.analysis.iostats import warm_page_cache  # noqa: E402
from stallscope.pipeline.builder import build_dataset, build_decode_limit_dataset  # noqa: E402
from stallscope.pipeline.describe import pipeline_as_run  # noqa: E402
from stallscope.pipeline.presets import get_preset  # noqa: E402
from stallscope.pipeline.sources import DataSource, open_source  # noqa: E402
from stallscope.records.convert import ConvertOptions, convert_tree  # noqa: E402

IMAGE_SIZE = 224
BATCH_SIZE = 32
SHARD_BYTES = 8 * 1024 * 1024


def make_images(root: Path, images_per_class: int) -> Path:
    """The built-in synthetic data set (train split only)."""
    from stallscope.data.synthetic import SyntheticOptions, make_synthetic

    make_synthetic(root, SyntheticOptions(classes=10, images_per_class=images_per_class, validation_fraction=0.0))
    return root


def write_records(source: DataSource, out: Path, max_side: int | None) -> Path:
    """TFRecords of the source's images, as `stallscope convert` writes them."""
    convert_tree(ConvertOptions(dataset_path=source.path, output_path=out, size_per_record=SHARD_BYTES,
                                max_side=max_side))
    return out


@dataclasses.dataclass
class Measurement:
    """Best wall-clock rate over the rounds, and the CPU time per image (all threads of the process).

    CPU time per image barely moves when other processes share the cores; images/s does.
    """

    rates: list[float] = dataclasses.field(default_factory=list)
    cpu_ms: list[float] = dataclasses.field(default_factory=list)

    @property
    def images_per_second(self) -> float:
        return max(self.rates)

    @property
    def cpu_ms_per_image(self) -> float:
        return statistics.median(self.cpu_ms)

    @property
    def cores_busy(self) -> float:
        return self.images_per_second * self.cpu_ms_per_image / 1000.0


def time_epochs(dataset, batches_per_epoch: int, epochs: int) -> tuple[float, float]:
    """As the training loop consumes a pipeline: one iterator over a repeating dataset. One untimed
    epoch (tracing, first buffer fills, the autotuner's ramp), then `epochs` epochs' worth of
    batches timed: (images/s, CPU ms per image). Each epoch boundary, e.g. the seed pipeline's
    shuffle-buffer refill, still counts, as it does in training."""
    iterator = iter(dataset)
    for _ in range(batches_per_epoch):
        next(iterator)
    images = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(batches_per_epoch * epochs):
        images += int(tf.nest.flatten(next(iterator))[0].shape[0])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return images / wall, 1000.0 * cpu / images


def measure_pipeline(config, source: DataSource, epochs: int, into: Measurement | None = None) -> Measurement:
    into = into or Measurement()
    warm_page_cache(source.files)
    dataset = build_dataset(config, source, repeat=True)
    rate, cpu_ms = time_epochs(dataset, max(1, source.num_examples // config.batch_size), epochs)
    into.rates.append(rate)
    into.cpu_ms.append(cpu_ms)
    return into


def measure_decode_limit(encoded: list[bytes], epochs: int, into: Measurement) -> Measurement:
    dataset = build_decode_limit_dataset(encoded, image_size=IMAGE_SIZE, batch_size=BATCH_SIZE)
    rate, cpu_ms = time_epochs(dataset, max(1, len(encoded) // BATCH_SIZE), epochs)
    into.rates.append(rate)
    into.cpu_ms.append(cpu_ms)
    return into


def explore_tuned(files: DataSource, records: DataSource, epochs: int) -> list[tuple[str, str, float]]:
    """Variants of `tuned`, one knob at a time, to show why the preset is what it is."""
    tuned = get_preset("tuned").replace(image_size=IMAGE_SIZE, batch_size=BATCH_SIZE)
    variants = {
        "tuned": {},
        "deterministic=False": {"deterministic": False},
        "max_intra_op_parallelism=0 (TF default)": {"max_intra_op_parallelism": 0},
        "map_parallelism=2": {"map_parallelism": 2},
        "map_parallelism=4": {"map_parallelism": 4},
        "interleave_cycle_length=2": {"interleave_cycle_length": 2},
        "read_parallelism=None (sequential read)": {"read_parallelism": None, "interleave_cycle_length": None},
        "shuffle_at=decoded": {"shuffle_at": "decoded"},
        "private_threadpool_size=2": {"private_threadpool_size": 2},
        "decode=scaled (changes pixels)": {"decode": "scaled"},
        "decode=crop (changes pixels)": {"decode": "crop"},
    }
    rows = []
    for source in (files, records):
        for label, changes in variants.items():
            if source.kind == "files" and "interleave_cycle_length" in changes:
                continue  # files are read by a map; the cycle length applies to shards only
            m = measure_pipeline(tuned.replace(**changes), source, epochs)
            rows.append((source.kind, label, m.images_per_second))
            print(f"  {source.kind:8s} {label:42s} {m.images_per_second:8.1f} images/s "
                  f"{m.cpu_ms_per_image:6.2f} CPU ms/image", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="working directory (default: a temporary one)")
    parser.add_argument("--images-per-class", type=int, default=50, help="10 classes of this many images")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all pipelines; the best counts")
    parser.add_argument("--explore", action="store_true", help="also measure variants of the tuned preset")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="stallscope-bench-") as scratch:
        work = args.out or Path(scratch)
        print(f"data: built-in synthetic, 10 classes x {args.images_per_class} images ...", flush=True)
        files = open_source("files", make_images(work / "images", args.images_per_class))
        records = open_source("records", write_records(files, work / "records", None))
        small = open_source("records", write_records(files, work / "records-256", 256))
        print(f"  files     {files.num_examples} images, {files.bytes_per_example / 1024:.0f} KB/image")
        print(f"  records   {len(records.files)} shards, {records.bytes_per_example / 1024:.0f} KB/image")
        print(f"  max-side 256: {len(small.files)} shards, {small.bytes_per_example / 1024:.0f} KB/image")
        print(f"cores: {os.cpu_count()}, image size {IMAGE_SIZE}, batch {BATCH_SIZE}, {args.epochs} timed epochs\n")

        def preset(name):
            return get_preset(name).replace(image_size=IMAGE_SIZE, batch_size=BATCH_SIZE)

        runs = [
            ("seed (files)", preset("seed"), files),
            ("autotune (files)", preset("autotune"), files),
            ("tuned (files)", preset("tuned"), files),
            ("tuned (records)", preset("tuned"), records),
            ("tuned (records, max side 256)", preset("tuned"), small),
        ]
        encoded = [Path(p).read_bytes() for p in files.files]
        decode_label = "decode limit (in memory, all cores)"
        results: dict[str, Measurement] = {label: Measurement() for label, _, _ in runs}
        results[decode_label] = Measurement()
        for round_index in range(args.rounds):  # rounds interleave the pipelines, so load spikes hit all
            for label, config, source in runs:
                measure_pipeline(config, source, args.epochs, into=results[label])
            measure_decode_limit(encoded, args.epochs, results[decode_label])
            print(f"  round {round_index + 1}/{args.rounds}: " + ", ".join(
                f"{label.split(' (')[0]} {m.rates[-1]:.0f}" for label, m in results.items()), flush=True)
        chains = {label: pipeline_as_run(build_dataset(config, source)) for label, config, source in runs}

        seed = results["seed (files)"].images_per_second
        decode = results[decode_label].images_per_second
        print(f"\n{'pipeline':38s} {'images/s':>9s} {'x seed':>7s} {'x decode':>9s} {'CPU ms/img':>11s} {'cores busy':>11s}")
        for label, m in results.items():
            rate = m.images_per_second
            print(f"{label:38s} {rate:9.1f} {rate / seed:7.2f} {rate / decode:9.2f} "
                  f"{m.cpu_ms_per_image:11.2f} {m.cores_busy:11.2f}")
        print(f"(images/s: best of {args.rounds} rounds; CPU ms/image: median)\n")
        for label, chain in chains.items():
            print(f"{label:38s} runs: {' <- '.join(chain)}")
        results = {label: m.images_per_second for label, m in results.items()}
        tuned_files = results["tuned (files)"]
        best_tuned = max(tuned_files, results["tuned (records)"])
        print("\ntargets (2 cores):")
        print(f"  tuned >= 0.9x decode limit : {best_tuned / decode:.2f}x")
        print(f"  tuned >= 1.8x seed          : {best_tuned / seed:.2f}x")
        print(f"  max-side 256 records >= 2x tuned from full-size files: "
              f"{results['tuned (records, max side 256)'] / tuned_files:.2f}x")
        if args.explore:
            print("\nvariants of tuned (one knob each):")
            explore_tuned(files, records, args.epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
