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


def test_a_large_file_that_is_no_profile_is_refused_without_reading_it_whole(tmp_path):
    """A 256 MB file named *.xplane.pb (sparse: zeros) was read whole, then refused (1 GB: 12 s, 1.65 GB)."""
    import tracemalloc

    big = tmp_path / "host.xplane.pb"
    with open(big, "wb") as stream:
        stream.truncate(256 * 1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"host.xplane.pb: not a readable XSpace profile \(byte 0 is 0x00"):
            load_profile(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024


def _two_captures(stalled_profile, root):
    """root/plugins/profile/{2020_01_01_00_00_00, 2020_01_01_00_00_09}/: the same real profile twice."""
    import shutil

    source = find_profile(stalled_profile)
    older, newer = (root / "plugins" / "profile" / name for name in ("2020_01_01_00_00_00", "2020_01_01_00_00_09"))
    for capture in (older, newer):
        capture.mkdir(parents=True)
        shutil.copy(source, capture / source.name)
    return older, newer / source.name


def test_a_capture_still_being_written_is_named_with_the_newest_complete_one(stalled_profile, tmp_path):
    from stallscope.analysis.analyze import analyze_run

    older, newest_file = _two_captures(stalled_profile, tmp_path / "run")
    data = newest_file.read_bytes()
    newest_file.write_bytes(data[: len(data) // 2])  # as TF leaves it halfway through writing (just now)
    with pytest.raises(DataError) as caught:
        analyze_run(tmp_path / "run", with_xprof=False)
    line = str(caught.value)
    assert line.startswith(f"{newest_file}: this capture is still being written")
    assert f"the newest complete capture is {older}: `--capture plugins/profile/2020_01_01_00_00_00` reads it" in line
    assert analyze_run(tmp_path / "run", with_xprof=False, capture="2020_01_01_00_00_00").steps.counted_steps > 0


def test_analyze_of_a_capture_still_being_written_is_one_line_naming_the_newest_complete_one(stalled_profile, tmp_path,
                                                                                            faults):
    """The same from the command line, on the fault suite's harness: one line, exit 2, nothing left."""
    older, newest_file = _two_captures(stalled_profile, tmp_path / "run")
    data = newest_file.read_bytes()
    newest_file.write_bytes(data[: len(data) // 2])
    outcome = faults.run("analyze of a capture still being written", ["analyze", tmp_path / "run"], 60)
    outcome.check(rc=2, within_s=30)
    line = outcome.stderr_lines[0]
    assert line.startswith(f"stallscope analyze: error: {newest_file}: this capture is still being written"), line
    assert f"the newest complete capture is {older}" in line
    assert newest_file.read_bytes() == data[: len(data) // 2]  # the user's file, untouched


def test_a_capture_cut_short_long_ago_is_named_as_damaged(stalled_profile, tmp_path):
    import os

    _, newest_file = _two_captures(stalled_profile, tmp_path / "run")
    data = newest_file.read_bytes()
    newest_file.write_bytes(data[: len(data) // 2])
    os.utime(newest_file, (1_600_000_000, 1_600_000_000))  # not written to for years
    with pytest.raises(DataError, match=r"not a readable XSpace profile \(the field at byte .* needs [0-9,]+ bytes "
                                        r"past its end\) \(a capture stopped while it was written\?\)"):
        load_profile(newest_file)


def test_a_capture_staged_by_stallscope_capture_is_not_read(stalled_profile, tmp_path):
    import shutil

    source = find_profile(stalled_profile)
    staged = tmp_path / "captures" / ".capture-partial-abc" / "plugins" / "profile" / "2030_01_01_00_00_00"
    staged.mkdir(parents=True)
    shutil.copy(source, staged / source.name)
    done = tmp_path / "captures" / "plugins" / "profile" / "2020_01_01_00_00_00"
    done.mkdir(parents=True)
    shutil.copy(source, done / source.name)
    assert find_profile(tmp_path / "captures") == done / source.name
