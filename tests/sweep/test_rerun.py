"""`sweep --against EARLIER`: each cell's re-run against the interval the earlier sweep stated for it, and
the stores that moved as a whole."""

from __future__ import annotations

import pytest

from stallscope.errors import DataError
from stallscope.sweep.interval import log_interval
from stallscope.sweep.rerun import compare, read_medians, rerun_summary, rerun_table, store_shifts, summary_path
from stallscope.sweep.table import CSV_NAME, RUN_FIELDS, SUMMARY_FIELDS, SUMMARY_NAME, write_rows


def _summary(folder, cells, runs=None, store="gcs"):
    """A summary.csv with these (cell, median, re-run low, re-run high) rows, the other columns empty; and a
    results.csv with `runs` (cell -> images/s of each run) where given, every cell on `store`."""
    folder.mkdir()
    rows = [{**{name: None for name in SUMMARY_FIELDS}, "cell": cell, "images_per_second_median": median,
             "images_per_second_rerun95_low": low, "images_per_second_rerun95_high": high}
            for cell, median, low, high in cells]
    write_rows(folder / SUMMARY_NAME, SUMMARY_FIELDS, rows)
    if runs is not None:
        write_rows(folder / CSV_NAME, RUN_FIELDS, [{**{name: None for name in RUN_FIELDS}, "cell": cell, "store": store,
                                                    "images_per_second": value}
                                                   for cell, values in runs.items() for value in values])
    return folder / SUMMARY_NAME


def test_each_cell_is_judged_against_the_earlier_rerun_interval(tmp_path):
    earlier = _summary(tmp_path / "first", [("a", 100.0, 90.0, 110.0), ("b", 500.0, 490.0, 510.0),
                                            ("c", 50.0, None, None), ("gone", 10.0, 9.0, 11.0)],
                       {"a": [95.0, 100.0, 105.0], "b": [495.0, 500.0, 505.0], "c": [50.0]})
    later = _summary(tmp_path / "second", [("a", 104.0, 95.0, 113.0), ("b", 470.0, 460.0, 480.0),
                                           ("c", 51.0, None, None), ("new", 7.0, None, None), ("empty", None, None, None)],
                     {"a": [99.0, 104.0, 109.0], "b": [465.0, 470.0, 475.0], "c": [51.0]})
    cells, missing = compare(earlier, later)
    judged = {c.cell: c for c in cells}
    assert sorted(judged) == ["a", "b", "c"] and missing == ["new"]
    a, b = judged["a"], judged["b"]
    assert a.within is True and a.agree is True and a.later_mean == pytest.approx((99.0 * 104.0 * 109.0) ** (1 / 3))
    assert a.apart == pytest.approx(a.later_mean / a.earlier_mean - 1)
    assert b.within is False and b.agree is False and b.apart == pytest.approx(0.06, abs=1e-4)
    assert judged["c"].within is None and judged["c"].agree is None  # one repeat: no interval, no spread
    line = rerun_summary(cells, tmp_path / "first", missing)
    assert ("1 of 2 cells inside the earlier sweep's 95% re-run intervals, 1 of 2 agree (the 95% interval of the "
            "difference of the two sweeps' means holds 0), 2 of 3 within 5% of its means") in line
    assert "1 earlier cell(s) had no interval" in line and "not in the earlier sweep: new" in line
    table = rerun_table(cells)
    assert table[2].startswith("| b | 500 | 490-510 | 470 | 6.0% | no | -"), "the cell outside its interval first"
    assert table[2].endswith(" | no |")
    row = b.row()
    assert row["within_rerun_interval"] is False and row["apart_pct"] == pytest.approx(6.0, abs=0.01)
    assert row["agree"] is False and row["difference_ci95_high"] < 0 and row["store"] == "gcs"


def test_an_earlier_summary_without_rerun_intervals_gets_them_from_its_runs(tmp_path):
    """A sweep summarised before re-run intervals existed: the interval is computed from its results.csv
    as `sweep` would state it now (here without pooling: two cells are too few)."""
    earlier = _summary(tmp_path / "first", [("a", 100.0, None, None), ("b", 20.0, None, None)],
                       {"a": [95.0, 100.0, 105.0], "b": [19.0, 20.0, 21.0]})
    later = _summary(tmp_path / "second", [("a", 101.0, None, None), ("b", 30.0, None, None)],
                     {"a": [96.0, 101.0, 106.0], "b": [29.0, 30.0, 31.0]})
    cells, _ = compare(earlier, later)
    a, b = cells
    expected = log_interval([95.0, 100.0, 105.0], rerun_repeats=3)
    assert (a.low, a.high) == pytest.approx((expected.low, expected.high))
    assert a.within is True and b.within is False


def test_a_store_that_moved_as_a_whole_is_named(tmp_path):
    """Every gs:// cell 3% slower the second time, each within its own noise: the store moved."""
    rates = {f"cell{i}": base for i, base in enumerate((100.0, 200.0, 400.0, 800.0, 50.0))}
    spread = (0.99, 1.0, 1.01)
    earlier = _summary(tmp_path / "first", [(c, r, None, None) for c, r in rates.items()],
                       {c: [r * f for f in spread] for c, r in rates.items()})
    later = _summary(tmp_path / "second", [(c, r * 0.97, None, None) for c, r in rates.items()],
                     {c: [r * 0.97 * f * (1 + 0.002 * i) for f in spread] for i, (c, r) in enumerate(rates.items())})
    cells, _ = compare(earlier, later)
    (shift,) = store_shifts(cells)
    assert shift.store == "gcs" and shift.cells == 5 and shift.moved
    assert shift.shift == pytest.approx(-0.026, abs=0.002) and shift.interval.high < 0
    line = rerun_summary(cells, tmp_path / "first", [])
    assert "; moved as a whole: gs:// 2.6% slower (95%: " in line
    assert "| gs:// | 5 | 2.6% slower (95%: " in "\n".join(rerun_table(cells))
    steady = _summary(tmp_path / "third", [(c, r, None, None) for c, r in rates.items()],
                      {c: [r * f * (1 + 0.004 * (-1) ** i) for f in spread] for i, (c, r) in enumerate(rates.items())})
    cells, _ = compare(earlier, steady)
    assert not store_shifts(cells)[0].moved and "moved as a whole" not in rerun_summary(cells, tmp_path, [])


def test_a_folder_that_is_not_a_sweep_is_one_line(tmp_path):
    with pytest.raises(DataError, match="--against: expected a sweep folder holding summary.csv"):
        summary_path(tmp_path)
    (tmp_path / SUMMARY_NAME).write_text("name,value\nx,1\n", encoding="utf-8")
    with pytest.raises(DataError, match="expected a sweep's summary.csv"):
        read_medians(summary_path(tmp_path))
