"""stallscope.profile / step and StallMonitor arguments: mistakes end in one clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

import stallscope
from stallscope.errors import UsageError
from stallscope.keras import StallMonitor, summary_line

from .conftest import tiny_data, tiny_model


def test_a_window_that_never_ran_is_not_taken_for_a_profile(tmp_path):
    with stallscope.profile(tmp_path, steps=(10, 20)) as window:
        for i in range(1, 4):
            with stallscope.step(i):
                pass
    assert window.captured_steps == 0
    assert not (tmp_path / "plugins").exists()
    with pytest.raises(UsageError, match=r"no step of the window 10:20 ran"):
        window.analyze()


def test_windows_do_not_nest(tmp_path):
    with stallscope.profile(tmp_path / "a", steps=(5, 6)):
        with pytest.raises(UsageError, match="already open"):
            with stallscope.profile(tmp_path / "b", steps=(5, 6)):
                pass


@pytest.mark.parametrize("steps", [(5, 2), (0, 3), ("a", 3), 7, None])
def test_bad_windows_name_themselves(steps, tmp_path):
    with pytest.raises(UsageError, match="steps"):
        stallscope.profile(tmp_path, steps=steps)


def test_stall_monitor_rejects_a_bad_window():
    with pytest.raises(UsageError, match="StallMonitor profile_steps"):
        StallMonitor(profile_steps=(3, "x"))


def test_a_dataset_that_is_not_one_names_the_argument(tmp_path):
    with pytest.raises(UsageError, match=r"^StallMonitor dataset: expected a tf.data.Dataset, got list$"):
        StallMonitor(dataset=[1, 2])
    with pytest.raises(UsageError, match=r"^stallscope.profile dataset: expected a tf.data.Dataset, got str$"):
        stallscope.profile(tmp_path, dataset="train/*.tfrecord")


def test_a_fit_that_raises_inside_its_window_does_not_block_the_next_one(tmp_path, caplog):
    """Keras calls no callback when fit raises: the next StallMonitor saves and closes what was left open."""
    import numpy as np
    import tensorflow as tf

    class FailAt(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:
                raise RuntimeError("the user's own callback failed")

    def model():
        net = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
        net.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return net

    x, y = np.zeros((64, 4), np.float32), np.zeros((64,), np.int64)
    with pytest.raises(RuntimeError, match="own callback failed"):
        model().fit(x, y, batch_size=4, epochs=1, verbose=0,
                    callbacks=[StallMonitor(profile_steps=(2, 8), log_dir=tmp_path / "failed", verbose=False),
                               FailAt()])
    second = StallMonitor(profile_steps=(2, 4), log_dir=tmp_path / "next", verbose=False)
    with caplog.at_level("WARNING", logger="stallscope.keras"):
        model().fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[second])
    assert "an earlier fit stopped inside its profile window 2:8" in caplog.text
    assert list((tmp_path / "failed" / "profile" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert (tmp_path / "failed" / "steps.csv").read_text().count("\n") == 1 + 4   # header and the 4 steps it ran
    assert second.analysis is not None and second.analysis.steps.counted_steps >= 1


def _steps_csv(folder):
    import csv

    with open(folder / "steps.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_failed_fit_whose_files_cannot_be_saved_does_not_break_the_next_fit(tmp_path, caplog):
    """Closing an earlier failed monitor may fail (its folder became a file): a warning, not the next fit's error."""
    import shutil

    import tensorflow as tf

    class FailAt(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:
                raise RuntimeError("the user's own callback failed")

    x, y = tiny_data()
    with pytest.raises(RuntimeError, match="own callback failed"):
        tiny_model().fit(x, y, batch_size=4, epochs=1, verbose=0,
                          callbacks=[StallMonitor(profile_steps=(2, 8), log_dir=tmp_path / "gone", verbose=False),
                                     FailAt()])
    shutil.rmtree(tmp_path / "gone")
    (tmp_path / "gone").write_text("now a file")
    second = StallMonitor(profile_steps=(2, 4), log_dir=tmp_path / "next", verbose=False)
    with caplog.at_level("WARNING", logger="stallscope.keras"):
        tiny_model().fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[second])
    assert "could not save what an earlier failed fit left" in caplog.text
    assert second.analysis is not None and len(_steps_csv(tmp_path / "next")) == 8


def test_a_monitor_reused_for_a_second_fit_starts_a_new_run(tmp_path, caplog):
    """Freeze, fit, unfreeze, fit again: each fit is numbered from 1, profiled and analysed; the first
    fit's files are kept in LOG_DIR/fit-1/."""
    x, y = tiny_data()
    model = tiny_model()
    monitor = StallMonitor(profile_steps=(3, 6), log_dir=tmp_path, verbose=False)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[monitor])
    first = monitor.analysis
    with caplog.at_level("WARNING", logger="stallscope.keras"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[monitor])
    assert "no profile was captured" not in caplog.text
    assert first is not None and monitor.analysis is not None and monitor.analysis is not first
    assert [s.step for s in monitor.analysis.steps.steps] == [3, 4, 5, 6]
    assert monitor.fits == 2
    for folder in (tmp_path, tmp_path / "fit-1"):   # each a whole run directory of its own fit
        rows = _steps_csv(folder)
        assert [int(r["step"]) for r in rows] == list(range(1, 9))
        assert float(rows[0]["started_s"]) < float(rows[-1]["started_s"])
        assert (folder / "resources.json").exists()
        assert len(list((folder / "profile" / "plugins" / "profile").glob("*/*.xplane.pb"))) == 1
    assert monitor.analysis.profile_path.startswith(str(tmp_path / "profile"))


def _loop(steps: int, iterator) -> None:
    for i in range(1, steps + 1):
        with stallscope.step(i):
            next(iterator)


def test_each_window_analyses_its_own_capture_and_cpu_figures(tmp_path):
    """Two windows into one log_dir, back to back: TF names captures by the second, so the second must
    not overwrite the first, and each window reads its own capture and resources.json."""
    import json

    import tensorflow as tf

    iterator = iter(tf.data.Dataset.range(1000).batch(4))
    with stallscope.profile(tmp_path, steps=(2, 4)) as first:
        _loop(6, iterator)
    with stallscope.profile(tmp_path, steps=(2, 4)) as second:
        _loop(6, iterator)
    one, two = first.analyze(), second.analyze()
    assert len(list((tmp_path / "plugins" / "profile").glob("*/*.xplane.pb"))) == 2
    assert Path(one.profile_path).parent != Path(two.profile_path).parent
    for window, analysis in ((first, one), (second, two)):
        assert Path(analysis.profile_path).parent == window.profiler.capture
        own = json.loads(json.dumps(window._resources.report.to_dict()))
        assert json.loads((Path(analysis.run_dir) / "resources.json").read_text()) == own


def test_a_log_dir_that_cannot_be_written_is_refused_when_given(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    expected = rf"expected a folder to write into, got '{afile}' \(a file is there\)$"
    with pytest.raises(UsageError, match=rf"^StallMonitor log_dir: {expected}"):
        StallMonitor(log_dir=afile)
    with pytest.raises(UsageError, match=rf"^stallscope.profile log_dir: {expected}"):
        stallscope.profile(afile)
    with pytest.raises(UsageError, match=r"^StallMonitor log_dir: .* '.*afile' is a file\)$"):
        StallMonitor(log_dir=afile / "sub")


def test_a_log_dir_in_a_read_only_folder_is_refused_when_given(tmp_path):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user writes into read-only folders (root)")
        with pytest.raises(UsageError, match=r"^StallMonitor log_dir: .* '.*locked' cannot be written\)$"):
            StallMonitor(log_dir=locked / "sub")
    finally:
        locked.chmod(0o755)


def test_steps_per_execution_counts_the_window_in_batches_and_says_so(tmp_path):
    """Under steps_per_execution=4 a step runs 4 batches: numbered by its first, profiled from the call
    holding the window's start (widened to enough whole calls, here to the fit's end), and the analysis
    says 4 batches per step."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(tiny_data()).repeat().batch(4)
    monitor = StallMonitor(profile_steps=(9, 16), log_dir=tmp_path, verbose=False)
    tiny_model(steps_per_execution=4).fit(dataset, steps_per_epoch=24, epochs=1, verbose=0, callbacks=[monitor],
                                               shuffle=False)  # a Dataset: nothing for Keras to shuffle
    assert [int(r["step"]) for r in _steps_csv(tmp_path)] == [1, 5, 9, 13, 17, 21]
    assert monitor.analysis.steps.batches_per_step == 4
    assert [s.step for s in monitor.analysis.steps.steps] == [9, 13, 17, 21]
    assert "each step runs 4 batches" in summary_line(monitor.analysis)


def test_step_inside_a_tf_function_names_the_mistake(tmp_path):
    import tensorflow as tf

    @tf.function
    def train_step(i):
        with stallscope.step(i):
            return i + 1

    with stallscope.profile(tmp_path, steps=(2, 3)):
        with pytest.raises(UsageError, match=r"stallscope.step: used inside a tf.function; put .* around the call"):
            train_step(tf.constant(1))


def test_analyze_pairs_an_earlier_fits_capture_with_that_fits_own_files(tmp_path, capsys):
    """A monitor reused on one log_dir: `analyze LOG --capture OLD` read the old capture beside the newest
    fit's steps.csv, pipeline.json and CPU figures; each capture now goes with the files of its own fit."""
    import json

    from stallscope.cli.main import main

    model = tiny_model()
    monitor = StallMonitor(profile_steps=(2, 4), log_dir=tmp_path, verbose=False)
    x, y = tiny_data(24)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[monitor])   # 6 steps
    x, y = tiny_data(40)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[monitor])   # 10 steps
    (old,) = (tmp_path / "fit-1" / "profile" / "plugins" / "profile").iterdir()
    # run_timing counts the steps past the first (warm-up) of the fit's steps.csv: 5 of 6, 9 of 10
    for capture, run_dir, steps in ((str(old.relative_to(tmp_path)), tmp_path / "fit-1", 5), (None, tmp_path, 9)):
        assert main(["analyze", str(tmp_path), "--no-xprof", "--json", *(["--capture", capture] if capture else [])]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["run_dir"] == str(run_dir), data["run_dir"]
        assert data["run_timing"]["steps"] == steps and data["profile"].startswith(str(run_dir / "profile"))


@pytest.mark.parametrize("name, text", [
    ("steps.csv", "epoch,loss\n1,0.5\n"),
    ("resources.json", '{"gpu": "mine"}'),
    ("pipeline.json", "[1, 2]"),
])
def test_a_file_of_the_users_in_the_log_dir_is_refused_and_kept(tmp_path, name, text):
    """StallMonitor replaced a steps.csv the user had in its log_dir; a file stallscope did not write is now
    refused in one line naming it, before any fit, and left as it was."""
    (tmp_path / name).write_text(text)
    with pytest.raises(UsageError, match=f"StallMonitor log_dir: .*{name}.* not written by stallscope") as caught:
        StallMonitor(profile_steps=None, log_dir=tmp_path, verbose=False)
    assert "\n" not in str(caught.value)
    assert (tmp_path / name).read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_profile_window_refuses_a_file_of_the_users_it_would_replace(tmp_path):
    """stallscope.profile writes LOG_DIR/resources.json and pipeline.json: a user's own is refused and kept."""
    (tmp_path / "resources.json").write_text('{"gpu": "mine"}')
    with pytest.raises(UsageError, match="stallscope.profile log_dir: .*resources.json.* not written by stallscope"):
        stallscope.profile(tmp_path, steps=(1, 2))
    assert (tmp_path / "resources.json").read_text() == '{"gpu": "mine"}'


def test_a_new_monitor_keeps_an_earlier_programs_run_in_its_log_dir(tmp_path):
    """A second program (a new monitor) on the log_dir of an earlier one: the earlier run moves aside
    (LOG_DIR/fit-1/) instead of being overwritten."""
    x, y = tiny_data(24)
    tiny_model().fit(x, y, batch_size=4, epochs=1, verbose=0,
                      callbacks=[StallMonitor(profile_steps=None, log_dir=tmp_path, verbose=False)])
    x, y = tiny_data(40)
    tiny_model().fit(x, y, batch_size=4, epochs=1, verbose=0,
                      callbacks=[StallMonitor(profile_steps=None, log_dir=tmp_path, verbose=False)])
    assert len(_steps_csv(tmp_path / "fit-1")) == 6 and len(_steps_csv(tmp_path)) == 10
