"""`make demo`: the whole loop on the built-in data set, against an emulated fast accelerator.

prepare synthetic -> convert to TFRecords -> verify -> train (seed and tuned pipelines, from JPEG
files and from records) -> diagnose the seed pipeline from files, then from records, apply the fix
and diagnose again -> one screen that answers seed-002's question: does TFRecord cut I/O calls and
training time, and what fixes the stall -> the same runs on an emulated object store (gs://, 10 ms
per request), where the seed's claim is about.

Run: `python -m stallscope.demo --out demo-output [--accelerator emulated:1000] [--steps 30]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
import time
from pathlib import Path

from stallscope.tfimport import import_tensorflow
from stallscope.verdict import fmt_share

DEFAULT_ACCELERATOR = "emulated:1000"
STORE_LATENCY_S = 0.010
# Reads spread over the steps, as in any data set larger than the seed's shuffle(10240): with the
# demo's 480 training images the seed's buffer would read them all in its first (warm-up) step.
STORE_SHUFFLE_BUFFER = 256
STORE_STEPS = 10


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    out: Path
    accelerator: str = DEFAULT_ACCELERATOR
    steps: int = 30
    shards: int = 8
    storage: bool = True  # act 5: the emulated object store


def _say(text: str = "") -> None:
    print(text, flush=True)


def _heading(text: str) -> None:
    _say()
    _say(f"== {text}")


def prepare_data(options: DemoOptions) -> tuple[Path, Path]:
    from stallscope.data.synthetic import make_synthetic
    from stallscope.records.convert import ConvertOptions, convert_tree, format_summary
    from stallscope.records.verify import verify_records

    data_dir, records_dir = options.out / "data", options.out / "records"
    _heading("1. the built-in data set (photo-like JPEGs from the photographs scikit-image and scikit-learn ship)")
    report = make_synthetic(data_dir)
    splits = ", ".join(f"{name} {count}" for name, count in report.images_per_split.items())
    state = "reused" if report.reused else f"made in {report.seconds:.1f} s"
    _say(f"{data_dir}: {len(report.labels)} classes, {splits} images, {report.bytes_total / 1e6:.1f} MB ({state})")

    _heading(f"2. convert to TFRecords ({options.shards} shards per split), then verify every record")
    converted = convert_tree(ConvertOptions(dataset_path=data_dir, output_path=records_dir, shards=options.shards))
    for line in format_summary(converted):
        _say(line)
    verified = verify_records(records_dir)
    _say(verified.summary_line())
    if not verified.ok:
        raise SystemExit("demo: verification failed; see the lines above")
    return data_dir, records_dir


def train_runs(options: DemoOptions, data_dir: Path, records_dir: Path) -> None:
    from stallscope.pipeline.presets import get_preset
    from stallscope.workload.train import TrainOptions, run_training

    _heading(f"3. fine-tuning workload, {options.steps} steps each, against an {options.accelerator} accelerator")
    _say(f"{'source':<8} {'pipeline':<8} {'images/s':>9} {'step':>9} {'input wait':>11} {'share':>7}  verdict")
    for source, path in (("files", data_dir), ("records", records_dir)):
        for preset in ("seed", "tuned"):
            run_dir = options.out / "runs" / f"{source}-{preset}"
            result = run_training(TrainOptions(
                source=source, dataset_path=path, pipeline=get_preset(preset), accelerator=options.accelerator,
                steps=options.steps, log_path=run_dir, log_every=10**6,
            ))
            _say(_run_line(source, preset, result.summary))
    _say(f"run directories (summary.json, steps.csv, TensorBoard): {options.out / 'runs'}")


def _run_line(source: str, pipeline: str, s: dict) -> str:
    return (f"{source:<8} {pipeline:<8} {s['images_per_second']:>9.0f} {s['step_time_ms']:>6.1f} ms "
            f"{s['input_wait_ms']:>8.1f} ms {fmt_share(s['input_share']):>6}  {s['verdict']} input-bound")


def diagnose_runs(options: DemoOptions, data_dir: Path, records_dir: Path):
    """Act 4; returns the fixed pipeline's config and the storage advice for files on act 5's store."""
    from stallscope.analysis.differential import DiagnoseOptions, diagnose
    from stallscope.analysis.fix_loop import fix
    from stallscope.analysis.storage_whatif import parse_scenarios
    from stallscope.pipeline.presets import get_preset
    from stallscope.workload.train import TrainOptions

    def workload(source: str, path: Path, config) -> DiagnoseOptions:
        return DiagnoseOptions(train=TrainOptions(source=source, dataset_path=path, pipeline=config,
                                                  accelerator=options.accelerator))

    _heading("4. diagnosis: the seed pipeline from JPEG files, from TFRecords, and the fixed pipeline")
    seed = get_preset("seed")
    # The storage what-if at the object store of act 5 rides along (a model: no extra probe).
    files_options = dataclasses.replace(workload("files", data_dir, seed), storage_client="tf-gcs",
                                        storage_scenarios=parse_scenarios(f"{STORE_LATENCY_S * 1000:g}ms,unlimited"))
    records_options = workload("records", records_dir, seed)
    _say("probing the seed pipeline from files ...")
    from_files = diagnose(files_options)
    _say("probing the seed pipeline from records ...")
    from_records = diagnose(records_options)
    fixed_path = options.out / "fixed-pipeline.json"
    _say("applying the advice and running again ...")
    fixed = fix(records_options, from_records, save_to=fixed_path)
    _say("probing the fixed pipeline from records ...")
    after = diagnose(workload("records", records_dir, fixed.config))
    _say()
    _print_comparison(("files, seed", from_files), ("records, seed", from_records), ("records, fixed", after))
    _say()
    _say("fix applied to the seed pipeline: " + "; ".join(
        f"{a.title} ({', '.join(f'{k}={v}' for k, v in a.knobs.items())})" for a in fixed.applied))
    _say(f"saved as {fixed_path}; reuse it with `stallscope train --pipeline-config {shlex.quote(str(fixed_path))}`")
    _say()
    _say(_seed_question(from_files, from_records, after))
    return fixed.config, [a for a in from_files.advice if a.key in ("gcs_reader", "reads_in_flight")]


def storage_runs(options: DemoOptions, fixed_config, store_advice) -> None:
    """Act 5: the seed and the fixed pipeline from files and from records on an emulated object store
    (`stallscope storage serve --gcs`, read through TF's own gs://, and with the storage advice through
    the reader it names), each also run from local disk with the same shuffle buffer and steps, for
    the ratio."""
    from stallscope.analysis.advice import apply_advice
    from stallscope.report.text import fmt_knobs
    from stallscope.pipeline.presets import get_preset
    from stallscope.storage.emulator import emulate
    from stallscope.storage.location import as_path
    from stallscope.workload.train import TrainOptions, run_training

    latency_ms = STORE_LATENCY_S * 1000
    _heading(f"5. the same data on an emulated object store: gs://, {latency_ms:.0f} ms per request "
             "(stallscope storage serve --gcs)")
    _say(f"shuffle buffer {STORE_SHUFFLE_BUFFER} so reads spread over the steps, as in any data set larger "
         f"than the buffer; {STORE_STEPS} steps each")
    pipelines = {"seed": get_preset("seed"), "fixed": fixed_config}
    for advice in store_advice:  # the diagnosis' storage what-if at this latency: the reader, reads in flight
        _say(f"fixed+io: the fixed pipeline with the storage advice: {advice.title} ({fmt_knobs(advice.knobs)})")
        pipelines["fixed+io"] = apply_advice(fixed_config, advice)
    remote: dict[tuple[str, str], dict] = {}
    local: dict[tuple[str, str], dict] = {}
    with emulate(options.out, kind="gcs", latency_s=STORE_LATENCY_S, max_duration_s=1800) as store:
        store.apply_env()  # TF reads its gs:// settings on first use: this process has not used gs:// yet
        _say(f"store: {store.url} (pid {store.pid}), serving {options.out}")
        _say(f"{'source':<8} {'pipeline':<8} {'images/s':>9} {'step':>9} {'input wait':>11} {'share':>7}  verdict")
        for source, folder in (("files", "data"), ("records", "records")):
            for name, config in pipelines.items():
                config = config.replace(shuffle_buffer=STORE_SHUFFLE_BUFFER)
                for where, path, table in (("gs://", as_path(f"{store.url}/{folder}"), remote),
                                           ("local", options.out / folder, local)):
                    result = run_training(TrainOptions(
                        source=source, dataset_path=path, pipeline=config, accelerator=options.accelerator,
                        steps=STORE_STEPS, log_path=options.out / "runs" / f"{where.rstrip(':/')}-{source}-{name}",
                        log_every=10**6,
                    ))
                    table[source, name] = result.summary
                    if where == "gs://":
                        _say(_run_line(source, name, result.summary))
        served = store.counters()
    _say(f"the store served {served.requests} requests on {served.connections} connections, "
         f"{served.bytes / 1e6:.1f} MB")
    _say()
    _say(_store_answer(remote, local, latency_ms))


def _store_answer(remote: dict, local: dict, latency_ms: float) -> str:
    """seed-002's claim (TFRecord cuts training time by ~80%) where each read pays a round trip."""
    def per_image_cut(table) -> str:
        return _change(1 / table["files", "seed"]["images_per_second"], 1 / table["records", "seed"]["images_per_second"])

    best = "fixed+io" if ("files", "fixed+io") in remote else "fixed"
    fixed_files = remote["files", best]["images_per_second"]
    return "\n".join([
        f"seed-002's claim on an object store at {latency_ms:.0f} ms per request, measured here:",
        f"  TFRecord vs JPEG files, seed pipeline: time per image {per_image_cut(remote)} on the store, "
        f"{per_image_cut(local)} on local disk.",
        f"  The {best} pipeline from files reaches {fixed_files:.0f} images/s on the store "
        f"({fixed_files / remote['files', 'seed']['images_per_second']:.1f}x the seed; "
        f"{fixed_files / local['files', best]['images_per_second']:.0%} of its local-disk speed), "
        f"and from records {remote['records', best]['images_per_second']:.0f} images/s "
        f"({remote['records', best]['images_per_second'] / local['records', best]['images_per_second']:.0%} of local).",
    ])


def _io(diagnosis):
    probe = diagnosis.cold or diagnosis.warm
    return probe.io_per_image


def _print_comparison(*columns) -> None:
    names = [name for name, _ in columns]
    rows = [
        ("step time (ms)", lambda d: f"{d.worst.step_ms:.1f}"),
        ("input wait (ms)", lambda d: f"{d.worst.input_wait_ms:.1f}"),
        ("input share", lambda d: fmt_share(d.input_share)),
        ("verdict", lambda d: f"{d.verdict}"),
        ("cause", lambda d: d.cause),
        ("images/s end to end", lambda d: f"{d.worst.end_to_end.images_per_second:.0f}"),
        ("pipeline alone, images/s", lambda d: f"{d.warm.images_per_second:.0f}"),
        ("read calls / image (cold)", lambda d: f"{_io(d).read_calls:.2f}" if _io(d) else "n/a"),
        ("KiB read / image (cold)", lambda d: f"{_io(d).bytes_read / 1024:.1f}" if _io(d) else "n/a"),
        ("files opened / image", lambda d: f"{_io(d).files_opened:.3f}" if _io(d) else "n/a"),
    ]
    width = max(len(label) for label, _ in rows) + 2
    _say(" " * width + "".join(f"{name:>16}" for name in names))
    for label, cell in rows:
        _say(f"{label:<{width}}" + "".join(f"{cell(d):>16}" for _, d in columns))


def _change(before: float, after: float) -> str:
    if before <= 0:
        return "n/a"
    return f"{(after - before) / before:+.0%}"


def _seed_question(files, records, fixed) -> str:
    """seed-002 asked whether TFRecord cuts I/O calls and training time; answer with the figures."""
    files_io, records_io = _io(files), _io(records)
    lines = ["seed-002's question, measured here:"]
    if files_io and records_io:
        lines.append(f"  TFRecord vs JPEG files, same seed pipeline: read calls per image "
                     f"{_change(files_io.read_calls, records_io.read_calls)}, files opened per image "
                     f"{_change(files_io.files_opened, records_io.files_opened)}, step time "
                     f"{_change(files.worst.step_ms, records.worst.step_ms)}.")
    lines.append(f"  The stall's cause is {records.cause}: fixing the pipeline changed the step time by "
                 f"{_change(records.worst.step_ms, fixed.worst.step_ms)} and the input share from "
                 f"{fmt_share(records.input_share, 0)} to {fmt_share(fixed.input_share, 0)}.")
    return "\n".join(lines)


def run_demo(options: DemoOptions) -> int:
    started = time.perf_counter()
    import_tensorflow()
    options.out.mkdir(parents=True, exist_ok=True)
    data_dir, records_dir = prepare_data(options)
    train_runs(options, data_dir, records_dir)
    fixed_config, store_advice = diagnose_runs(options, data_dir, records_dir)
    if options.storage:
        storage_runs(options, fixed_config, store_advice)
    _say()
    _say(f"demo finished in {time.perf_counter() - started:.0f} s; everything it wrote is under {options.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stallscope.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("demo-output"), help="where everything goes")
    parser.add_argument("--accelerator", default=DEFAULT_ACCELERATOR, help="emulated device (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per run (default: %(default)s)")
    parser.add_argument("--no-storage", action="store_true", help="leave out act 5, the emulated object store")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from stallscope.errors import StallscopeError

    try:
        return run_demo(DemoOptions(out=args.out, accelerator=args.accelerator, steps=args.steps,
                                    storage=not args.no_storage))
    except StallscopeError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
