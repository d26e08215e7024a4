"""`analyze` on profiles of users' own programs (no stallscope markers), run as real subprocesses.

Each program writes its own wall-clock time per step; the step time stallscope finds in the
profile must agree with it within 10%, and the stalled variant must read as highly input-bound
with the map stage named, the healthy one not.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.analysis.analyze import analyze_run
from stallscope.analysis.xplane import find_captures
from stallscope.errors import DataError, UsageError

PROGRAMS = Path(__file__).parent / "programs"


def run_program(tmp_path: Path, script: str, *args: str) -> tuple[Path, dict]:
    log_dir, times = tmp_path / "log", tmp_path / "times.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
        [str(PROGRAMS), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, str(PROGRAMS / script), str(log_dir), str(times), *args],
                   check=True, env=env, timeout=300, capture_output=True)
    return log_dir, json.loads(times.read_text())


# Every program the tests below run, by the fixture that hands its results to them, in the order the
# tests need them: {fixture: {run: (script, *arguments)}}.
RUNS = {
    "keras_variants": {
        "per_call_4": ("keras_fit.py", "stalled", "4"),
        "validate": ("keras_fit.py", "stalled", "1", "--validate"),
        "mirrored": ("keras_mirrored.py", "stalled"),
        "mirrored_healthy": ("keras_mirrored.py", "healthy"),
        "profiler": ("keras_fit.py", "stalled", "--profiler"),
    },
    "keras_runs": {kind: ("keras_fit.py", kind) for kind in ("stalled", "healthy", "numpy")},
    "tensors_run": {"tensors": ("custom_loop.py", "tensors")},
    "loop_runs": {kind: ("custom_loop.py", kind) for kind in ("stalled", "healthy")},
    "eager_runs": {kind: ("eager_loop.py", kind) for kind in ("stalled", "healthy")},
}


@pytest.fixture(scope="module")
def own_runs(request, tmp_path_factory):
    """The programs of every RUNS fixture that a selected test of this module uses, each in a folder of its
    own, started together and run two at a time: most of a program's time is TF's start-up, and each
    one's figures are held against its own timing of the same steps."""
    used = {name for item in request.session.items if item.module is request.module for name in item.fixturenames}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = {(group, name): pool.submit(run_program, tmp_path_factory.mktemp(f"{group}-{name}"), *program)
                   for group, programs in RUNS.items() if group in used for name, program in programs.items()}
        try:
            yield running
        finally:
            for future in running.values():
                future.cancel()


def _results(own_runs, group: str) -> dict[str, tuple[Path, dict]]:
    return {name: future.result() for (of, name), future in own_runs.items() if of == group}


@pytest.fixture(scope="module")
def keras_runs(own_runs):
    return _results(own_runs, "keras_runs")


@pytest.fixture(scope="module")
def loop_runs(own_runs):
    return _results(own_runs, "loop_runs")


@pytest.fixture(scope="module")
def tensors_run(own_runs):
    return _results(own_runs, "tensors_run")["tensors"]


@pytest.fixture(scope="module")
def eager_runs(own_runs):
    return _results(own_runs, "eager_runs")


def own_mean_ms(times: dict, numbers: list[int]) -> float:
    by_batch = {b["batch"]: b["ms"] for b in times["batches"]}
    return sum(by_batch[n] for n in numbers) / len(numbers)


def keras_counted_mean_ms(analysis, times: dict) -> float:
    """The program's own mean over the steps stallscope counted. Keras numbers a step by its first
    batch and restarts at each epoch; the program counts batches over all epochs."""
    steps, per_call = analysis.steps.steps, times["steps_per_execution"]
    numbers = [steps[0].step + index * per_call for index, s in enumerate(steps) if s.counted]
    assert len(numbers) >= 5
    return own_mean_ms(times, numbers)


@pytest.fixture(scope="module")
def keras_variants(own_runs):
    return _results(own_runs, "keras_variants")


def test_steps_per_execution_is_said_and_reported_per_batch(keras_variants):
    from stallscope.report.text import render_text

    log_dir, times = keras_variants["per_call_4"]
    analysis = analyze_run(log_dir, with_xprof=False)
    assert analysis.steps.batches_per_step == 4
    assert all(s.get_next_calls == 4 for s in analysis.steps.steps)
    assert analysis.steps.step_ms.mean == pytest.approx(keras_counted_mean_ms(analysis, times), rel=0.10)
    assert "each step runs 4 batches (steps_per_execution=4)" in render_text(analysis)
    assert analysis.verdict == "highly" and analysis.bottleneck == "Map"


def test_validation_inside_the_window_is_kept_out_of_the_training_steps(keras_variants):
    log_dir, times = keras_variants["validate"]
    analysis = analyze_run(log_dir, with_xprof=False)
    steps = analysis.steps.steps
    assert [s.step for s in steps][:2] == [4, 5] and steps[-1].step < steps[0].step  # epoch 2 restarts
    assert all(s.get_next_calls == 1 for s in steps)   # the validation batches fall between steps
    assert analysis.steps.step_ms.mean == pytest.approx(keras_counted_mean_ms(analysis, times), rel=0.10)
    assert len(analysis.captures) == 1 and "/train/" in analysis.profile_path


def test_mirrored_strategy_on_two_logical_cpus(keras_variants):
    from stallscope.report.text import render_text

    log_dir, times = keras_variants["mirrored"]
    analysis = analyze_run(log_dir, with_xprof=False)
    assert analysis.steps.batches_per_step == 1
    assert analysis.steps.step_ms.mean == pytest.approx(keras_counted_mean_ms(analysis, times), rel=0.10)
    assert analysis.verdict == "highly" and analysis.bottleneck == "Map"
    assert "Generator" in [stage.name for stage in analysis.tree.stages]   # the per-device feed, walked past
    feed = next(stage for stage in analysis.tree.stages if stage.name == "Generator")
    assert feed.device_feed and feed.label == "Generator (device feed)"
    assert "tf.distribute's per-device iterator" in render_text(analysis)
    assert "parallel_generator" not in [a.key for a in (*analysis.advice, *analysis.checked)]
    healthy = analyze_run(keras_variants["mirrored_healthy"][0], with_xprof=False)
    assert healthy.verdict != "highly" and healthy.steps.has_iterator


def test_fit_profiled_without_the_tensorboard_callback_uses_keras_calls(keras_variants):
    """tf.profiler start/stop around fit: no 'Profiled batch' spans, one multi_step_on_iterator per step."""
    log_dir, times = keras_variants["profiler"]
    analysis = analyze_run(log_dir, with_xprof=False)
    assert analysis.steps.method == "Keras' multi_step_on_iterator calls"
    first = times["profile_batch"][0]
    counted = [first + index for index, s in enumerate(analysis.steps.steps) if s.counted]
    assert len(counted) >= 5
    assert analysis.steps.step_ms.mean == pytest.approx(own_mean_ms(times, counted), rel=0.10)
    assert analysis.verdict == "highly" and analysis.bottleneck == "Map"


@pytest.mark.parametrize("kind", ["stalled", "healthy"])
def test_keras_fit_log_dir_is_found_and_steps_agree_with_its_own_timing(keras_runs, kind):
    log_dir, times = keras_runs[kind]
    analysis = analyze_run(log_dir, with_xprof=False)   # the LOG dir given to TensorBoard, not LOG/train
    assert "/train/plugins/profile/" in analysis.profile_path
    assert analysis.steps.method == "Keras' 'Profiled batch' spans"
    assert analysis.steps.step_ms.mean == pytest.approx(keras_counted_mean_ms(analysis, times), rel=0.10)


def test_keras_fit_stalled_is_input_bound_at_the_map_and_healthy_is_not(keras_runs):
    stalled = analyze_run(keras_runs["stalled"][0], with_xprof=False)
    healthy = analyze_run(keras_runs["healthy"][0], with_xprof=False)
    assert stalled.verdict == "highly" and stalled.input_share > 0.5
    assert stalled.bottleneck == "Map"
    assert healthy.verdict != "highly" and healthy.input_share < 0.2
    assert healthy.steps.has_iterator


def test_numpy_fed_fit_is_read_as_keras_own_pipeline(keras_runs):
    """Keras 3 wraps NumPy arrays in a tf.data pipeline of its own: its iterator is in the profile."""
    analysis = analyze_run(keras_runs["numpy"][0], with_xprof=False)
    assert analysis.steps.counted_steps >= 5 and analysis.steps.has_iterator
    assert analysis.verdict != "highly"


def test_steps_fed_without_an_iterator_say_so_instead_of_a_zero_share(tensors_run):
    from stallscope.report.text import render_text

    log_dir, _ = tensors_run
    analysis = analyze_run(log_dir, with_xprof=False)
    assert analysis.steps.counted_steps >= 5
    assert not analysis.steps.has_iterator
    assert any("no tf.data iterator" in note for note in analysis.notes)
    assert "Input share: not measurable" in render_text(analysis)


@pytest.mark.parametrize("kind", ["stalled", "healthy"])
def test_custom_loop_steps_are_the_step_function_calls(loop_runs, kind):
    log_dir, times = loop_runs[kind]
    analysis = analyze_run(log_dir, with_xprof=False)
    assert "'train_step'" in analysis.steps.method
    first = times["profile_batch"][0]
    counted = [first + index for index, s in enumerate(analysis.steps.steps) if s.counted]
    assert len(counted) >= 5
    assert analysis.steps.step_ms.mean == pytest.approx(own_mean_ms(times, counted), rel=0.10)
    if kind == "stalled":
        assert analysis.verdict == "highly" and analysis.bottleneck == "Map"
    else:
        assert analysis.verdict != "highly"


@pytest.mark.parametrize("kind", ["stalled", "healthy"])
def test_eager_loop_steps_run_from_one_next_to_the_next(eager_runs, kind):
    log_dir, times = eager_runs[kind]
    analysis = analyze_run(log_dir, with_xprof=False)
    assert analysis.steps.method.startswith("eager next(iterator)")
    first = times["profile_batch"][0]
    counted = [first + index for index, s in enumerate(analysis.steps.steps) if s.counted]
    assert len(counted) >= 5
    assert analysis.steps.step_ms.mean == pytest.approx(own_mean_ms(times, counted), rel=0.10)
    if kind == "stalled":
        assert analysis.verdict == "highly" and analysis.bottleneck == "Map"
    else:
        assert analysis.verdict != "highly"


def test_every_host_of_a_capture_is_read_and_the_slowest_named(loop_runs, tmp_path):
    """Two real profiles placed as host1/host2 of one capture: the stalled host is the slowest."""
    from stallscope.report.text import render_text

    capture = tmp_path / "log" / "plugins" / "profile" / "2026_01_01_00_00_00"
    capture.mkdir(parents=True)
    for host, kind in (("host1", "healthy"), ("host2", "stalled")):
        shutil.copy(next(find_captures(loop_runs[kind][0])[0].glob("*.xplane.pb")), capture / f"{host}.xplane.pb")
    analysis = analyze_run(tmp_path / "log", with_xprof=False)
    assert [h.host for h in analysis.hosts] == ["host1", "host2"]
    assert analysis.slowest_host == "host2" and analysis.profile_path.endswith("host2.xplane.pb")
    shares = {h.host: h.steps.input_share for h in analysis.hosts}
    assert shares["host2"] > 0.5 > shares["host1"]
    assert analysis.input_share == shares["host2"] and analysis.bottleneck == "Map"
    text = render_text(analysis)
    assert "2 hosts in this capture" in text and "host2" in text and "<- slowest" in text
    assert analysis.to_dict()["slowest_host"] == "host2"


def test_newest_capture_is_read_and_another_can_be_chosen(keras_runs, loop_runs, tmp_path):
    """Two captures under one log: the newest by name is read, `capture=` picks the other."""
    log = tmp_path / "log"
    old = next(iter(find_captures(loop_runs["stalled"][0])))
    new = next(iter(find_captures(keras_runs["healthy"][0])))
    shutil.copytree(old, log / "plugins" / "profile" / "2000_01_01_00_00_00")
    shutil.copytree(new, log / "train" / "plugins" / "profile" / "2099_01_01_00_00_00")
    newest = analyze_run(log, with_xprof=False)
    assert "2099_01_01_00_00_00" in newest.profile_path and len(newest.captures) == 2
    chosen = analyze_run(log, with_xprof=False, capture="2000_01_01_00_00_00")
    assert "'train_step'" in chosen.steps.method
    with pytest.raises(UsageError, match="--capture: no capture 'nope'"):
        analyze_run(log, with_xprof=False, capture="nope")


def test_cli_capture_flag_and_reports_say_how_steps_were_found(keras_runs, loop_runs, tmp_path, capsys):
    from stallscope.cli.main import main

    log = tmp_path / "log"
    shutil.copytree(keras_runs["stalled"][0], log)
    shutil.copytree(loop_runs["healthy"][0] / "plugins", log / "plugins")
    names = [c.name for c in find_captures(log)]
    assert main(["analyze", str(log), "--no-xprof", "--capture", names[0]]) == 0
    text = capsys.readouterr().out
    assert "other capture(s) (choose with --capture NAME)" in text and names[1] in text
    assert main(["analyze", str(log), "--no-xprof", "--markdown"]) == 0
    assert "found by" in capsys.readouterr().out
    assert main(["analyze", str(log), "--no-xprof", "--capture", "nope"]) == 2
    assert "--capture: no capture 'nope'" in capsys.readouterr().err


def test_profile_without_any_steps_names_what_was_looked_for(tmp_path):
    import tensorflow as tf

    tf.profiler.experimental.start(str(tmp_path))
    tf.constant(1.0) + 1.0
    tf.profiler.experimental.stop()
    with pytest.raises(DataError, match="no steps found") as raised:
        analyze_run(tmp_path, with_xprof=False)
    assert "StallMonitor" in str(raised.value) and "stallscope.profile" in str(raised.value)
