"""Benchmark: what the training loop's own measuring costs, through `run_training` itself.

In one run, over the built-in synthetic data set (photo-like JPEGs of about 500x375) and an
emulated device:
- profiling overhead: mean step time of a run profiled over all its measured steps vs the same run
  unprofiled (target: under 5% slower), in alternating rounds so machine noise hits both alike;
- emulated accuracy: the emulated compute per step vs the speed asked for (the wait's overshoot);
- a real tiny model's step time, for scale against the emulated device.
Prints ratios against the baselines measured here.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device-ms", type=float, default=40.0, help="emulated step time (ms)")
    args = parser.parse_args()

    from stallscope.data.synthetic import SyntheticOptions, make_synthetic
    from stallscope.pipeline.presets import get_preset
    from stallscope.workload.train import TrainOptions, run_training

    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "data"
        make_synthetic(tree, SyntheticOptions(classes=4, images_per_class=40, validation_fraction=0.0))
        pipeline = get_preset("tuned").replace(batch_size=16, shuffle_buffer=64)
        warmup = 5

        def run(name: str, profile: bool, accelerator: str, **extra):
            options = TrainOptions(source="files", dataset_path=tree, pipeline=pipeline, steps=args.steps,
                                   accelerator=accelerator, log_path=Path(tmp) / name, warmup_steps=warmup,
                                   profile_steps=(warmup + 1, args.steps) if profile else None, **extra)
            return run_training(options).stats

        plain, profiled, overshoot = [], [], []
        for round_ in range(args.rounds):
            for profile in ((False, True) if round_ % 2 == 0 else (True, False)):
                stats = run(f"r{round_}-{'p' if profile else 'n'}", profile, f"emulated:{args.device_ms:g}ms")
                (profiled if profile else plain).append(stats.step_time_ms)
                overshoot.append(stats.compute_ms - args.device_ms)
        base, prof = statistics.median(plain), statistics.median(profiled)
        print(f"tuned pipeline from 500x375 JPEGs, batch 16, emulated {args.device_ms:g} ms/step, "
              f"{args.steps} steps x {args.rounds} rounds")
        print(f"  unprofiled step   {base:8.2f} ms  (baseline)")
        print(f"  profiled step     {prof:8.2f} ms  ratio {prof / base:.3f}  (target < 1.05)")
        print(f"  emulated wait overshoot {statistics.median(overshoot):.2f} ms per step "
              f"({statistics.median(overshoot) / args.device_ms * 100:.1f}% of the asked {args.device_ms:g} ms)")
        real = run("real", False, "real", model="mobilenet", alpha=0.25)
        print(f"  real MobileNet(alpha 0.25, 224) step {real.step_time_ms:.1f} ms, "
              f"{real.images_per_second:.1f} img/s, input share {real.input_share * 100:.1f}%")


if __name__ == "__main__":
    main()
