"""The sweep's grid, its refusals and the knee, without running anything."""

from __future__ import annotations

import pytest

from stallscope.errors import UsageError
from stallscope.sweep.grid import LOCAL, Axes, Cell, Grid, differences, latency_seconds, parse_latency
from stallscope.sweep.knee import knee


@pytest.mark.parametrize("text, expected", [("local", LOCAL), ("0ms", "0ms"), ("10", "10ms"), ("0.03s", "30ms"),
                                            ("500us", "0.5ms"), (" 3 ms ", "3ms")])
def test_latency_spellings(text, expected):
    assert parse_latency(text) == expected


def test_latency_seconds():
    assert latency_seconds(LOCAL) is None
    assert latency_seconds("10ms") == pytest.approx(0.010)


def test_cells_span_every_combination_with_readable_names():
    axes = Axes.parse(formats="files,records", latencies="local,10ms", pipelines="seed,tuned",
                      accelerators="emulated:500,emulated:15ms", learning_rates="1e-4,1e-3")
    cells = Grid(axes=axes, repeats=3, shared={}).cells()
    assert len(cells) == 32 and len(set(cells)) == 32
    assert len({c.name for c in cells}) == 32
    assert Cell("files", "10ms", "seed", "emulated:15ms", 1e-4).name == "files-10ms-seed-emulated_15ms-lr0.0001"


def test_same_accelerator_spelled_twice_is_refused():
    with pytest.raises(UsageError, match="--accelerator: expected each value once"):
        Axes.parse(formats="files", latencies="local", pipelines="seed", accelerators="emulated:500,Emulated:500",
                   learning_rates="1e-4")


def test_differences_name_each_changed_setting():
    old = Grid(Axes(pipelines=("seed", "tuned")), 3, {"steps": 20}).to_dict()
    new = Grid(Axes(pipelines=("seed",)), 1, {"steps": 20}).to_dict()
    assert differences(old, new) == ["pipelines: seed,tuned -> seed", "repeats: 3 -> 1"]
    assert differences(old, old) == []


def test_knee_interpolates_the_crossing_on_log_speed():
    assert knee([(100, 0.0), (400, 0.4)]) == pytest.approx(200.0)
    assert knee([(1000, 0.5), (100, 0.01), (300, 0.1)]) > 300
    assert knee([(100, 0.01), (1000, 0.1)]) is None
    assert knee([(100, 0.3), (1000, 0.6)]) is None


def test_profiled_steps_are_the_last_ones_or_none():
    from stallscope.sweep.runner import profile_window

    assert profile_window({"steps": 20, "profile_last": 2}) == (19, 20)
    assert profile_window({"steps": 20, "profile_last": 0}) is None
