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
