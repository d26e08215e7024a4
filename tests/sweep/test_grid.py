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
    assert Cell(format="files", store="gcs", latency="10ms", pipeline="seed", accelerator="emulated:15ms",
                learning_rate=1e-4).name == "files-gcs-10ms-seed-emulated_15ms-lr0.0001"


def test_the_store_axis_multiplies_latency_and_bandwidth_for_emulated_stores_only():
    """local disk is one cell per other combination; every emulated store gets every latency and cap."""
    axes = Axes.parse(formats="files,records", stores="local,gcs,s3,mount", latencies="0ms,10ms",
                      bandwidths="none,200Mbit", pipelines="seed", accelerators="emulated:500", learning_rates="1e-4")
    cells = Grid(axes=axes, repeats=2, shared={}).cells()
    assert len(cells) == 2 * (1 + 3 * 2 * 2) and len({c.name for c in cells}) == len(cells)
    local = [c for c in cells if c.store == LOCAL]
    assert [(c.latency, c.bandwidth_bps, c.latency_ms) for c in local] == [(LOCAL, None, None)] * 2
    assert {(c.store, c.latency, c.bandwidth_bps) for c in cells if c.store == "s3"} == {
        ("s3", "0ms", None), ("s3", "0ms", 200e6), ("s3", "10ms", None), ("s3", "10ms", 200e6)}
    named = next(c for c in cells if c.store == "mount" and c.bandwidth_bps and c.latency == "10ms")
    assert named.name == "files-mount-10ms-200Mbit-seed-emulated_500-lr0.0001"
    assert named.where == "FUSE mount 10ms 200Mbit" and named.latency_ms == 10.0


def test_local_among_the_latencies_is_the_local_store_and_gcs_the_default_emulated_one():
    """As before the store axis: --latency local,10ms sweeps local disk and an emulated gs:// store."""
    axes = Axes.parse(formats="files", latencies="local,10ms", pipelines="seed", accelerators="real",
                      learning_rates="1e-4")
    assert (axes.stores, axes.latencies) == ((LOCAL, "gcs"), ("10ms",))
    assert Axes.parse(formats="files", stores="s3", latencies="local,0ms", pipelines="seed", accelerators="real",
                      learning_rates="1e-4").stores == (LOCAL, "s3")


@pytest.mark.parametrize("stores, latencies, bandwidths, expected", [
    ("gcs", "local", None, "--store: gcs is an emulated store, which needs a per-request --latency"),
    ("local", "10ms", None, "--latency: 10ms applies to an emulated store; expected --store gcs, s3, mount"),
    ("local,ftp", "10ms", None, "--store: expected stores from local, gcs, s3, mount, got 'ftp'"),
    ("gcs", "10ms", "fast", "--bandwidth: expected bandwidths such as 200Mbit"),
    ("gcs", "10ms", "1Gbit,1000Mbit", "--bandwidth: expected each value once"),
    ("local", "local", "1Gbit", "--bandwidth: applies to an emulated store"),
])
def test_store_axis_refusals_name_their_flag(stores, latencies, bandwidths, expected):
    with pytest.raises(UsageError) as caught:
        Axes.parse(formats="files", stores=stores, latencies=latencies, bandwidths=bandwidths, pipelines="seed",
                   accelerators="real", learning_rates="1e-4")
    assert str(caught.value).startswith(expected), str(caught.value)


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


def test_a_sweep_runs_repeat_by_repeat_so_drift_spreads_over_every_cell(tmp_path):
    """The proof sweep's re-run put 7 of 40 medians 1-4% outside intervals its first run drew from three
    runs in a row of each cell: what drifted between the cells' turns shifted whole cells. Each cell's
    first run comes now, then each one's second: the drift goes into every cell's spread."""
    from stallscope.sweep.runner import RunOutcome, Sweep

    ran = []

    class Recorded(Sweep):
        def _run_one(self, cell, repeat, folder, run_dir, index, total):  # the order is what is tested
            ran.append((cell.pipeline, repeat, index))
            return RunOutcome(cell, repeat, run_dir, ran=True, failure=None)

    grid = Grid(Axes(pipelines=("seed", "tuned")), 2, {"steps": 2, "dataset_path": str(tmp_path), "knobs": {}})
    outcomes = Recorded(grid, tmp_path / "out", records_path=None).run()
    assert ran == [("seed", 1, 1), ("tuned", 1, 2), ("seed", 2, 3), ("tuned", 2, 4)]
    assert [(o.cell.pipeline, o.repeat) for o in outcomes] == [("seed", 1), ("seed", 2), ("tuned", 1), ("tuned", 2)]
