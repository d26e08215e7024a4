"""Benchmark: is stallscope's fix right for your own program, whatever kind of program it is?

Six programs of the kinds users write, each reading the built-in data set's JPEGs from local disk with
the same user-written tf.data pipeline and training the same small model (a `fit` timed from its
training's start to its end by a callback, leaving out the iterator's teardown after it):
  fit            Keras `fit`
  fit-spe4       Keras `fit` with steps_per_execution=4
  custom-loop    a `tf.function` train step over the dataset's iterator
  mirrored-loop  the same under a MirroredStrategy (one device here), on its distributed dataset
  generator      Keras `fit` of a `from_generator` source of file names
  live-loop      the custom loop as a live job in a process of its own, with a profiler server:
                 its advice comes from `stallscope capture` of it running (analyze's fixes), not diagnose
Each has a stalled variant (a decode map TF leaves sequential, because its random flip is a stateful op,
and no prefetch) and a healthy one (decoded images cached, decode parallel, prefetched).

For each stalled program: `stallscope.diagnose(dataset, model=model)` lists its fixes; all of them with
knobs applied as the program would write them (the fix), then a search by hand over map parallelism x
prefetch x a private pool; every config timed by the program's own clock (images/s over the same steps,
after a warm-up). Each listed fix carries its predicted gain and is also applied alone for its predicted
against its measured gain. For each healthy program: whether any fix is listed (none expected).

Targets (issue "advice you can trust"): fix >= 0.8x the best found; each listed fix gains at least half
of what it predicts; no healthy variant gets a fix.

usage: python benchmarks/advice_programs.py [--images-per-class 48] [--steps 40] [--repeats 3] [--programs fit,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PROGRAMS = ("fit", "fit-spe4", "custom-loop", "mirrored-loop", "generator", "live-loop")
LIVE_PORT = 6019
LIVE_CAPTURE = "3s"
IMAGE, BATCH, CLASSES = 64, 32, 10
AUTOTUNE = -1
# knobs of stallscope's advice a user-written pipeline of this shape has a place for
APPLICABLE = {"map_parallelism", "prefetch", "private_threadpool_size", "max_intra_op_parallelism", "cache",
              "cache_at", "deterministic"}
SEARCH = [  # (map parallelism, prefetch, private pool) searched by hand
    (2, AUTOTUNE, 0), (AUTOTUNE, None, 0), (AUTOTUNE, AUTOTUNE, 0), (AUTOTUNE, AUTOTUNE, 4), (None, AUTOTUNE, 0)]
STALLED = {"map_parallelism": None, "prefetch": None}
HEALTHY = {"map_parallelism": AUTOTUNE, "prefetch": AUTOTUNE, "cache": "memory", "cache_at": "decoded"}


def prepare(scratch: Path, images_per_class: int) -> tuple[list[str], list[int]]:
    from stallscope.cli.main import main

    tree = scratch / "data"
    if main(["prepare", "synthetic", "--output", str(tree), "--images-per-class", str(images_per_class),
             "--validation-fraction", "0"]) != 0:
        raise SystemExit("prepare failed")
    classes = sorted(p.name for p in (tree / "train").iterdir() if p.is_dir())
    files = sorted(str(p) for p in (tree / "train").rglob("*.jpg"))
    return files, [classes.index(Path(f).parent.name) for f in files]


def build(files: list[str], labels: list[int], knobs: dict, *, generator: bool):
    """The user's pipeline, written as most programs write it, with `knobs` (stallscope's names) in the
    places such a program has for them."""
    import tensorflow as tf

    def read(path, label):
        return tf.io.read_file(path), label

    def decode(encoded, label):
        image = tf.image.resize(tf.image.decode_jpeg(encoded, channels=3), [IMAGE, IMAGE]) / 255.0
        return image, label

    def flip(image, label):
        return tf.image.random_flip_left_right(image), label  # stateful: TF leaves a map holding it sequential

    if generator:
        def names():
            yield from zip(files, labels)
        source = tf.data.Dataset.from_generator(names, output_signature=(tf.TensorSpec([], tf.string),
                                                                         tf.TensorSpec([], tf.int32)))
    else:
        source = tf.data.Dataset.from_tensor_slices((files, labels))
    calls = knobs.get("map_parallelism")
    cache, cache_at = knobs.get("cache", "none"), knobs.get("cache_at", "decoded")
    ds = source.map(read)
    if cache != "none" and cache_at == "encoded":
        ds = ds.cache()
    ds = ds.shuffle(len(files), seed=0)
    if cache != "none" and cache_at == "decoded":
        ds = ds.map(decode, num_parallel_calls=calls).cache().repeat().map(flip, num_parallel_calls=calls)
    else:
        ds = ds.repeat().map(lambda e, y: flip(*decode(e, y)), num_parallel_calls=calls)
    ds = ds.batch(BATCH, drop_remainder=True)
    if knobs.get("prefetch") is not None:
        ds = ds.prefetch(knobs["prefetch"])
    options = tf.data.Options()
    if knobs.get("private_threadpool_size"):
        options.threading.private_threadpool_size = knobs["private_threadpool_size"]
    if knobs.get("max_intra_op_parallelism"):
        options.threading.max_intra_op_parallelism = knobs["max_intra_op_parallelism"]
    if knobs.get("deterministic") is not None:
        options.deterministic = knobs["deterministic"]
    return ds.with_options(options)


def make_model(strategy=None, steps_per_execution: int = 1):
    import tensorflow as tf

    def net():
        model = tf.keras.Sequential([
            tf.keras.Input((IMAGE, IMAGE, 3)),
            tf.keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            tf.keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(CLASSES),
        ])
        model.compile(tf.keras.optimizers.Adam(1e-3), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)
        return model
    if strategy is None:
        return net()
    with strategy.scope():
        return net()


def training_clock():
    """fit's own clock from its training's start to its end (a callback, as a program times its steps):
    the whole fit() call also holds the dataset iterator's teardown after training, 0 or about 0.53 s
    here, by chance per call (measured by this callback: every step alike, the extra after
    on_train_end), which made the same config time at about 1,000 or 1,700 images/s."""
    import tensorflow as tf

    class Clock(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.started = time.perf_counter()

        def on_train_end(self, logs=None):
            self.seconds = time.perf_counter() - self.started

    return Clock()


class Program:
    """One kind of program: its model, and its own clock over `steps` steps of a dataset."""

    def __init__(self, kind: str):
        import tensorflow as tf

        kind = "custom-loop" if kind == "live-loop" else kind  # the same loop, timed here
        self.kind = kind
        self.strategy = tf.distribute.MirroredStrategy(["/cpu:0"]) if kind == "mirrored-loop" else None
        self.model = make_model(self.strategy, steps_per_execution=4 if kind == "fit-spe4" else 1)
        self.generator = kind == "generator"

    def train_step(self):
        """The custom loops' step: a tf.function of one batch (under the strategy, where there is one)."""
        import tensorflow as tf

        model, loss_fn, optimizer = self.model, self.model.loss, self.model.optimizer

        def one_step(images, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        if self.strategy is None:
            return tf.function(one_step)
        strategy = self.strategy
        return tf.function(lambda images, labels: strategy.run(one_step, args=(images, labels)))

    def images_per_second(self, ds, steps: int, warmup: int = 4) -> float:
        import tensorflow as tf

        if self.kind in ("fit", "fit-spe4", "generator"):
            self.model.fit(ds, steps_per_epoch=warmup * 4 if self.kind == "fit-spe4" else warmup, epochs=1, verbose=0)
            clock = training_clock()
            self.model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
            return steps * BATCH / clock.seconds
        step = self.train_step()
        if self.strategy is None:
            batches = iter(ds)
        else:
            strategy = self.strategy
            batches = iter(strategy.experimental_distribute_dataset(ds))
        for _ in range(warmup):
            step(*next(batches))
        started = time.perf_counter()
        for _ in range(steps):
            loss = step(*next(batches))
        float(tf.reduce_sum(strategy.experimental_local_results(loss)) if self.strategy else loss)
        return steps * BATCH / (time.perf_counter() - started)


def live_job(files_json: str, knobs_json: str, ready: str, seconds: float) -> None:
    """The custom loop as a live job: a profiler server on LIVE_PORT (stallscope.serve_profiler), then
    steps until `seconds` pass; `ready` is written once the server is up and the loop runs."""
    import stallscope

    files, labels = json.loads(Path(files_json).read_text())
    step = Program("custom-loop").train_step()
    stallscope.serve_profiler(LIVE_PORT)
    batches = iter(build(files, labels, json.loads(knobs_json), generator=False))
    step(*next(batches))
    Path(ready).write_text("ready")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        step(*next(batches))


def captured_advice(files: list[str], labels: list[int], knobs: dict):
    """(verdict, input share, fixes) of `stallscope capture` of the live job run with `knobs`."""
    with tempfile.TemporaryDirectory(prefix="live-loop-") as scratch:
        return _captured_advice(files, labels, knobs, Path(scratch))


def _captured_advice(files: list[str], labels: list[int], knobs: dict, scratch: Path):
    import subprocess

    from stallscope.analysis.advice import Advice

    data, ready = scratch / "files.json", scratch / "ready"
    data.write_text(json.dumps([files, labels]))
    job = subprocess.Popen([sys.executable, __file__, "--live-job", str(data), json.dumps(knobs), str(ready), "90"])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not ready.exists():
            raise SystemExit("the live job did not start")
        time.sleep(2)  # past its first steps
        done = subprocess.run([sys.executable, "-m", "stallscope", "capture", f"localhost:{LIVE_PORT}", "--duration",
                               LIVE_CAPTURE, "--json", "--no-xprof", "--log-path", str(scratch / "capture")],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SystemExit(f"capture failed: {done.stderr.strip()}")
    finally:
        job.terminate()
        job.wait(timeout=30)
    report = json.loads(done.stdout)
    fields = {f.name for f in dataclasses.fields(Advice)}
    advice = [Advice(**{k: v for k, v in a.items() if k in fields}) for a in report["advice"]]
    return report["verdict"], report["input_share"], advice


def knobs_of(advice) -> dict:
    return {k: v for a in advice for k, v in a.knobs.items()}


def with_knobs(base: dict, knobs: dict) -> tuple[dict, list[str]]:
    """`base` with the applicable knobs set; and the knobs this program has no place for."""
    return {**base, **{k: v for k, v in knobs.items() if k in APPLICABLE}}, sorted(set(knobs) - APPLICABLE)


def run_program(kind: str, files, labels, steps: int, repeats: int, work_dir: Path) -> dict:
    import stallscope

    program = Program(kind)

    def rate(knobs: dict) -> float:  # the median of `repeats` runs: other work on the cores moves one run
        return statistics.median(program.images_per_second(build(files, labels, knobs, generator=program.generator),
                                                           steps) for _ in range(repeats))

    def advised(knobs: dict):  # (verdict, input share, advice): a capture of the live job, else diagnose
        if kind == "live-loop":
            return captured_advice(files, labels, knobs)
        found = stallscope.diagnose(build(files, labels, knobs, generator=program.generator), model=program.model,
                                    steps=20, work_dir=work_dir)  # its profiles go with the scratch folder
        return found.verdict, found.input_share, found.advice

    verdict, share, advice = advised(STALLED)
    listed = [a for a in advice if a.knobs]
    seed_rate = rate(STALLED)
    fix_knobs, missing = with_knobs(STALLED, knobs_of(listed))
    fix_rate = rate(fix_knobs) if listed else seed_rate
    searched = {(m, p, pool): rate({"map_parallelism": m, "prefetch": p, "private_threadpool_size": pool})
                for m, p, pool in SEARCH}
    best_at = max(searched, key=searched.get)
    gains = []
    for advice in listed:  # every listed fix carries its predicted gain: each applied alone, as it was priced
        if advice.predicted_gain is None:
            continue
        alone, _ = with_knobs(STALLED, advice.knobs)
        gains.append({"program": kind, "fix": advice.key, "predicted_gain": advice.predicted_gain,
                      "measured_gain": rate(alone) / seed_rate - 1.0})
    healthy_verdict, healthy_share, healthy_advice = advised(HEALTHY)
    return {"program": kind, "verdict": verdict, "input_share": share,
            "seed": seed_rate, "fix": fix_rate, "best": max(searched[best_at], seed_rate), "best_at": best_at,
            "fixes": [a.key for a in listed], "fix_knobs": {k: v for k, v in fix_knobs.items() if STALLED.get(k) != v},
            "not_applicable": missing, "gains": gains,
            "healthy_verdict": healthy_verdict, "healthy_share": healthy_share,
            "healthy_fixes": [a.key for a in healthy_advice]}


def _knob(value) -> str:
    return "-" if value is None else ("autotune" if value == AUTOTUNE else str(value))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images-per-class", type=int, default=48)
    parser.add_argument("--steps", type=int, default=40, help="timed steps of each config")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each config (their median is taken)")
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--live-job", nargs=4, default=None, help=argparse.SUPPRESS)  # the live-loop's process
    args = parser.parse_args()
    if args.live_job:
        files_json, knobs_json, ready, seconds = args.live_job
        live_job(files_json, knobs_json, ready, float(seconds))
        return
    kinds = [k for k in args.programs.split(",") if k]
    unknown = sorted(set(kinds) - set(PROGRAMS))
    if unknown:
        parser.error(f"--programs: unknown {', '.join(unknown)}; expected some of {', '.join(PROGRAMS)}")

    import tensorflow as tf  # noqa: F401  (loaded once, before the first program)

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        files, labels = prepare(Path(scratch), args.images_per_class)
        for kind in kinds:
            rows.append(run_program(kind, files, labels, args.steps, args.repeats, Path(scratch) / "diagnoses"))
            print(f"  done: {kind}", file=sys.stderr, flush=True)

    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))
    print(f"advice for your own program: {len(files)} JPEGs on local disk, {IMAGE} px, batches of {BATCH}, "
          f"{args.steps} steps a config, median of {args.repeats} runs; images/s by the program's own clock")
    print(f"  {'program':<15}{'verdict':<9}{'stalled':>9}{'fix':>8}{'best':>8}  {'fix/best':>8}  "
          f"{'best by hand (map, prefetch, pool)':<36}fixes listed")
    for r in rows:
        m, p, pool = r["best_at"]
        hand = f"{_knob(m)}, {_knob(p)}, {pool or '-'}"
        extra = f"  (no place for {', '.join(r['not_applicable'])})" if r["not_applicable"] else ""
        knobs = ", ".join(f"{k}={_knob(v) if isinstance(v, int) and not isinstance(v, bool) else v}"
                          for k, v in r["fix_knobs"].items())
        print(f"  {r['program']:<15}{r['verdict']:<9}{r['seed']:>9,.0f}{r['fix']:>8,.0f}{r['best']:>8,.0f}  "
              f"{r['fix'] / r['best']:>7.2f}x  {hand:<36}{', '.join(r['fixes']) or 'none'} ({knobs}){extra}")
    print("each listed fix alone: predicted vs measured gain (target: measured >= half)")
    for r in rows:
        for g in r["gains"]:
            held = "ok" if g["measured_gain"] >= 0.5 * g["predicted_gain"] else "SHORT"
            print(f"  {g['program']:<15}{g['fix']:<18}predicted {g['predicted_gain']:+7.0%}  "
                  f"measured {g['measured_gain']:+7.0%}  {held}")
    print("healthy variant (decoded images cached, parallel, prefetched): no fix expected")
    for r in rows:
        print(f"  {r['program']:<15}{r['healthy_verdict']:<11}{r['healthy_share']:>6.1%} input  "
              f"fixes: {', '.join(r['healthy_fixes']) or 'none'}")


if __name__ == "__main__":
    main()
