"""StallMonitor and diagnose() say what they measured in the user's own terms: a window of whole calls
under steps_per_execution, the caveat in the callback's own line, the images of each step, and nothing
left in the temporary folder that the user did not ask to keep."""

from __future__ import annotations

import csv
import tempfile

import pytest
import tensorflow as tf

import stallscope
from stallscope.keras import NOT_KEPT, StallMonitor, in_whole_calls, min_profiled_calls
from stallscope.workload.marking import batch_size_of
from stallscope.workload.profiling import ProfileWindow

from .conftest import tiny_data, tiny_model

BATCH = 4


def _dataset():
    return tf.data.Dataset.from_tensor_slices(tiny_data()).repeat().batch(BATCH)


def _steps_csv(folder):
    with open(folder / "steps.csv", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture
def own_temp(tmp_path, monkeypatch):
    """A temporary folder of this test's own, so what other programs leave in the machine's is not counted."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_window_under_steps_per_execution_is_widened_to_enough_whole_calls():
    assert in_whole_calls(ProfileWindow(5, 15), 1) == ProfileWindow(5, 15)
    assert in_whole_calls(None, 4) is None
    calls = min_profiled_calls()
    assert in_whole_calls(ProfileWindow(5, 15), 4) == ProfileWindow(5, 5 + 4 * calls - 1)
    assert in_whole_calls(ProfileWindow(6, 15), 4).start == 5          # the call holding batch 6 starts at 5
    assert in_whole_calls(ProfileWindow(1, 100), 4) == ProfileWindow(1, 100)  # already 25 whole calls


def test_steps_per_execution_profiles_enough_calls_for_a_verdict_and_says_so(tmp_path, capsys):
    """profile_steps=(5, 15) at steps_per_execution=4 profiled 3 calls and counted 1, and printed the
    verdict with no caveat: the window now holds enough whole calls, and the line names them."""
    monitor = StallMonitor(profile_steps=(5, 15), log_dir=tmp_path, dataset=_dataset())
    tiny_model(steps_per_execution=4).fit(_dataset(), steps_per_epoch=48, epochs=1, verbose=0, callbacks=[monitor],
                                      shuffle=False)
    analysis = monitor.analysis
    assert analysis.steps.batches_per_step == 4
    assert [s.step for s in analysis.steps.steps] == list(range(5, 5 + 4 * min_profiled_calls(), 4))
    assert analysis.steps.counted_steps >= 5 and analysis.warnings == ()
    printed = capsys.readouterr().out
    assert f"profiled batches 5:{4 + 4 * min_profiled_calls()} ({min_profiled_calls()} whole calls" in printed
    assert "caution" not in printed


def test_a_verdict_from_too_few_steps_says_so_in_the_callbacks_own_line(tmp_path, capsys):
    """The fit ends two calls into the widened window: the line printed carries the warning."""
    monitor = StallMonitor(profile_steps=(5, 15), log_dir=tmp_path)
    x, y = tiny_data(48)   # 12 batches: calls 1, 5, 9
    tiny_model(steps_per_execution=4).fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[monitor])
    assert monitor.analysis.steps.counted_steps < 5
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("stallscope:"))
    assert "caution: only 2 steps counted" in line and "steps_per_execution=4" in line


def test_steps_csv_counts_the_batch_from_the_dataset_and_leaves_an_unknown_empty(tmp_path):
    """images was 0 on every row: it is the dataset's batch times the step's batches, or empty."""
    with_dataset, without = tmp_path / "with", tmp_path / "without"
    tiny_model(steps_per_execution=2).fit(_dataset(), steps_per_epoch=8, epochs=1, verbose=0, shuffle=False, callbacks=[
        StallMonitor(profile_steps=None, log_dir=with_dataset, dataset=_dataset())])
    assert {row["images"] for row in _steps_csv(with_dataset)} == {str(2 * BATCH)}
    x, y = tiny_data()
    tiny_model().fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[
        StallMonitor(profile_steps=(2, 6), log_dir=without, verbose=False)])
    assert {row["images"] for row in _steps_csv(without)} == {""}
    run = stallscope.analyze(without, with_xprof=False).run
    assert run.steps == 7 and run.images_per_second is None   # not known, not 0 images/s


def test_the_batch_size_is_read_through_the_stages_that_keep_one_element_each():
    base = tf.data.Dataset.range(100)
    assert batch_size_of(base.batch(8).map(lambda x: x * 2).prefetch(2)) == 8
    assert batch_size_of(base.batch(8, drop_remainder=True)) == 8
    assert batch_size_of(base.batch(8).unbatch().batch(3)) == 3
    assert batch_size_of(base.batch(8).filter(lambda x: True)) is None
    assert batch_size_of(None) is None


def test_a_monitor_without_log_dir_leaves_nothing_in_the_temporary_folder(own_temp, capsys):
    x, y = tiny_data()
    monitor = StallMonitor(profile_steps=(2, 6))
    tiny_model().fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[monitor])
    assert list(own_temp.iterdir()) == []
    analysis = monitor.analysis
    assert analysis.profile_path == NOT_KEPT and analysis.run_dir is None
    assert analysis.steps.counted_steps == 3 and analysis.to_dict()["profile"] == NOT_KEPT
    assert "profile not kept: give log_dir= to keep it" in capsys.readouterr().out


def test_diagnose_without_work_dir_leaves_nothing_and_with_one_keeps_its_profile(own_temp, tmp_path):
    dataset = tf.data.Dataset.from_tensor_slices(tiny_data()).repeat().batch(BATCH).prefetch(2)
    diagnosis = stallscope.diagnose(dataset, steps=4)
    assert list(own_temp.iterdir()) == []
    assert diagnosis.analysis is not None and diagnosis.analysis.profile_path.startswith("(not kept")
    assert "profile: (not kept: diagnose without work_dir)" in diagnosis.text()
    kept = stallscope.diagnose(dataset, steps=4, work_dir=tmp_path / "work")
    (folder,) = (tmp_path / "work").iterdir()
    assert kept.analysis.profile_path.startswith(str(folder)) and kept.analysis.profile_path.endswith(".xplane.pb")
