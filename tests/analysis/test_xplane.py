"""Loading real TF profiles: path forms, resolved names and stats, clear errors."""

from __future__ import annotations

import pytest

from stallscope.analysis.xplane import find_profile, load_profile
from stallscope.errors import DataError, UsageError


def test_run_dir_capture_dir_and_file_resolve_to_the_same_profile(stalled_profile):
    from_dir = find_profile(stalled_profile)
    assert from_dir.name.endswith(".xplane.pb")
    assert find_profile(from_dir.parent) == from_dir
    assert find_profile(from_dir) == from_dir


def test_events_carry_long_names_stats_and_absolute_times(stalled_profile):
    profile = load_profile(stalled_profile)
    events = list(profile.host.events())
    markers = [e for e in events if e.name == "train"]
    assert [e.stat("step_num") for e in markers] == list(range(len(markers)))
    maps = [e for e in events if e.name == "Iterator::Root::BatchV2::Map"]
    assert maps and maps[0].display_name == "Iterator::Map"
    assert maps[0].stat("name").startswith("MapDataset")
    assert isinstance(maps[0].stat("parent_id"), int)
    # one time base for every thread: a step marker contains the get_next events of other lines
    get_next = [e for e in events if e.name == "IteratorGetNextOp::DoCompute"]
    assert any(markers[1].start_ps <= g.start_ps < markers[1].end_ps for g in get_next)
    assert all(a.end_ps <= b.start_ps for a, b in zip(markers, markers[1:]))


def test_path_without_profile_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no TF profile found"):
        find_profile(tmp_path)


def test_wrong_file_and_missing_path_are_usage_errors(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("x")
    with pytest.raises(UsageError, match="not a TF profile"):
        find_profile(other)
    with pytest.raises(UsageError, match="does not exist"):
        find_profile(tmp_path / "missing")


def test_damaged_profile_is_named(tmp_path):
    bad = tmp_path / "host.xplane.pb"
    bad.write_bytes(b"\xff\xff\xff not a proto")
    with pytest.raises(DataError, match="host.xplane.pb"):
        load_profile(bad)
