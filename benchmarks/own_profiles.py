"""Benchmark: how long `analyze` takes on a user's own 100-step Keras `fit` profile (target < 2 s).

The profile is written by the test suite's Keras script (TensorBoard callback, no step markers) with
a 100-batch window. Printed against baselines from the same run: reading the profile alone, and
the 2 s target.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAMS = Path(__file__).resolve().parent.parent / "tests" / "analysis" / "programs"


def write_profile(log_dir: Path, steps: int) -> None:
    code = ("import sys, keras_fit as k; k.STEPS = %d; k.PROFILE = (3, %d); "
            "sys.argv = ['keras_fit', %r, %r, 'healthy']; k.main()") % (
        steps + 10, steps + 2, str(log_dir), str(log_dir / "times.json"))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
        [str(PROGRAMS), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, timeout=600)


def timed(function, *args, **kwargs) -> tuple[float, object]:
    function(*args, **kwargs)  # warm imports and the page cache
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()

    from stallscope.analysis.analyze import analyze_run
    from stallscope.analysis.xplane import find_profile, load_profile

    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "log"
        write_profile(log_dir, args.steps)
        file = find_profile(log_dir)
        load_s, _ = timed(load_profile, file)
        plain_s, analysis = timed(analyze_run, log_dir, with_xprof=False)
        xprof_s, _ = timed(analyze_run, log_dir, with_xprof=True)
        print(f"Keras fit profile, {len(analysis.steps.steps)} steps found by {analysis.steps.method} "
              f"({file.stat().st_size / 1e6:.1f} MB):")
        print(f"  reading the profile alone       {load_s:6.2f} s   1.00x")
        for label, seconds in (("analyze", plain_s), ("analyze + xprof cross-check", xprof_s)):
            print(f"  {label:<31} {seconds:6.2f} s   {seconds / load_s:5.2f}x reading, "
                  f"{seconds / 2.0:5.2f}x of the 2 s target")


if __name__ == "__main__":
    main()
