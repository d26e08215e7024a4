"""stallscope.profile / step and StallMonitor arguments: mistakes end in one clear message."""

from __future__ import annotations

import pytest

import stallscope
from stallscope.errors import UsageError
from stallscope.keras import StallMonitor


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
