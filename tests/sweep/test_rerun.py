"""`sweep --against EARLIER`: each cell's median against the earlier sweep's 95% interval."""

from __future__ import annotations

import pytest

from stallscope.errors import DataError
from stallscope.sweep.rerun import compare, read_medians, rerun_summary, rerun_table, summary_path
from stallscope.sweep.table import CSV_NAME, RUN_FIELDS, SUMMARY_FIELDS, SUMMARY_NAME, write_rows


def _summary(folder, cells, runs=None):
    """A summary.csv with these (cell, median, low, high) rows, the other columns empty; and a results.csv
    with `runs` (cell -> images/s of each run) where given."""
    folder.mkdir()
    rows = [{**{name: None for name in SUMMARY_FIELDS}, "cell": cell, "images_per_second_median": median,
             "images_per_second_ci95_low": low, "images_per_second_ci95_high": high}
            for cell, median, low, high in cells]
    write_rows(folder / SUMMARY_NAME, SUMMARY_FIELDS, rows)
    if runs is not None:
        write_rows(folder / CSV_NAME, RUN_FIELDS, [{**{name: None for name in RUN_FIELDS}, "cell": cell,
                                                    "images_per_second": value}
                                                   for cell, values in runs.items() for value in values])
    return folder / SUMMARY_NAME


def test_each_cell_is_judged_against_the_earlier_interval(tmp_path):
    earlier = _summary(tmp_path / "first", [("a", 100.0, 90.0, 110.0), ("b", 500.0, 490.0, 510.0),
                                            ("c", 50.0, None, None), ("gone", 10.0, 9.0, 11.0)],
                       {"a": [95.0, 100.0, 105.0], "b": [495.0, 500.0, 505.0], "c": [50.0]})
    later = _summary(tmp_path / "second", [("a", 104.0, 95.0, 113.0), ("b", 470.0, 460.0, 480.0),
                                           ("c", 51.0, None, None), ("new", 7.0, None, None), ("empty", None, None, None)],
                     {"a": [99.0, 104.0, 109.0], "b": [465.0, 470.0, 475.0], "c": [51.0]})
    cells, missing = compare(earlier, later)
    judged = {c.cell: c for c in cells}
    assert sorted(judged) == ["a", "b", "c"] and missing == ["new"]
    assert judged["a"].within is True and judged["a"].apart == pytest.approx(0.04) and judged["a"].agree is True
    assert judged["b"].within is False and judged["b"].apart == pytest.approx(0.06) and judged["b"].agree is False
    assert judged["c"].within is None and judged["c"].agree is None  # one repeat: no interval, no spread
    line = rerun_summary(cells, tmp_path / "first", missing)
    assert ("1 of 2 cells agree (the 95% interval of the difference of the two sweeps' means holds 0), 1 of 2 "
            "medians inside the earlier sweep's 95% intervals, 2 of 3 within 5% of its medians") in line
    assert "1 earlier cell(s) had no interval" in line and "not in the earlier sweep: new" in line
    table = rerun_table(cells)
    assert table[2].startswith("| b | 500 | 490-510 | 470 | 6.0% | no | -"), "the cell that disagrees first"
    assert table[2].endswith(" | no |")
    row = judged["b"].row()
    assert row["within_interval"] is False and row["apart_pct"] == pytest.approx(6.0) and row["agree"] is False
    assert row["difference_ci95_high"] < 0


def test_a_median_outside_a_narrow_interval_can_still_agree(tmp_path):
    """Three runs that agree closely make a narrow interval of their mean; a re-run whose runs spread
    more can put its median outside it while the two sweeps' runs do not differ beyond their noise."""
    earlier = _summary(tmp_path / "first", [("a", 728.0, 726.0, 729.0)], {"a": [727.0, 728.0, 728.5]})
    later = _summary(tmp_path / "second", [("a", 699.0, 600.0, 820.0)], {"a": [699.0, 660.0, 760.0]})
    (cell,), _ = compare(earlier, later)
    assert cell.within is False and cell.agree is True


def test_a_folder_that_is_not_a_sweep_is_one_line(tmp_path):
    with pytest.raises(DataError, match="--against: expected a sweep folder holding summary.csv"):
        summary_path(tmp_path)
    (tmp_path / SUMMARY_NAME).write_text("name,value\nx,1\n", encoding="utf-8")
    with pytest.raises(DataError, match="expected a sweep's summary.csv"):
        read_medians(summary_path(tmp_path))
