"""A sweep run again beside an earlier one (`sweep --against EARLIER`): whether the two sweeps' repeats of
each cell agree (the 95% Welch interval of the difference of their means holds 0), whether each median
falls inside the earlier sweep's 95% interval, and how far the two medians are apart. It answers the
question a reviewer asks of a figure, "does it hold when you run it again?", from the two sweeps'
summary.csv and results.csv files.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from stallscope.errors import DataError
from stallscope.sweep.interval import Interval, difference_interval
from stallscope.sweep.table import CSV_NAME, SUMMARY_NAME, write_rows

RERUN_NAME = "rerun.csv"
RERUN_FIELDS = ("cell", "earlier_images_per_second_median", "earlier_ci95_low", "earlier_ci95_high",
                "images_per_second_median", "within_interval", "apart_pct", "difference_ci95_low",
                "difference_ci95_high", "agree")
CLOSE_SHARE = 0.05  # two medians this close (of the earlier) are counted apart from the interval's verdict


@dataclasses.dataclass(frozen=True)
class RerunCell:
    """One cell of both sweeps: the earlier median and interval, the later median."""

    cell: str
    earlier: float
    low: float | None
    high: float | None
    later: float
    earlier_runs: tuple[float, ...] = ()
    later_runs: tuple[float, ...] = ()

    @property
    def difference(self) -> Interval | None:
        """The 95% Welch interval of the later mean less the earlier; None with under two runs in either."""
        return difference_interval(list(self.earlier_runs), list(self.later_runs))

    @property
    def agree(self) -> bool | None:
        """Whether the two sweeps' runs agree within their noise (the difference's interval holds 0)."""
        d = self.difference
        return None if d is None else d.low <= 0.0 <= d.high

    @property
    def within(self) -> bool | None:
        """Whether the later median lies inside the earlier interval; None where that had none (one repeat)."""
        if self.low is None or self.high is None:
            return None
        return self.low <= self.later <= self.high

    @property
    def apart(self) -> float:
        """The later median's distance from the earlier, as a share of the earlier."""
        return abs(self.later - self.earlier) / self.earlier if self.earlier > 0 else float("inf")

    def row(self) -> dict[str, object]:
        d = self.difference
        return {"cell": self.cell, "earlier_images_per_second_median": self.earlier, "earlier_ci95_low": self.low,
                "earlier_ci95_high": self.high, "images_per_second_median": self.later,
                "within_interval": self.within, "apart_pct": self.apart * 100.0,
                "difference_ci95_low": d.low if d else None, "difference_ci95_high": d.high if d else None,
                "agree": self.agree}


def summary_path(folder: Path) -> Path:
    """The summary.csv of a sweep folder, or a one-line error naming what is missing."""
    path = Path(folder) / SUMMARY_NAME
    if not path.is_file():
        raise DataError(f"--against: expected a sweep folder holding {SUMMARY_NAME}, got {str(folder)!r} without one")
    return path


def read_medians(path: Path) -> dict[str, tuple[float, float | None, float | None]]:
    """cell -> (images/s median, interval low, high) of each cell with a complete run."""
    def number(text: str | None) -> float | None:
        return float(text) if text not in (None, "") else None

    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: not a readable sweep summary ({exc})") from None
    if rows and "images_per_second_median" not in rows[0]:
        raise DataError(f"{path}: expected a sweep's {SUMMARY_NAME} (an images_per_second_median column), got "
                        f"columns {', '.join(list(rows[0])[:4])} ...")
    found = {}
    for row in rows:
        median = number(row.get("images_per_second_median"))
        if median is not None:
            found[row["cell"]] = (median, number(row.get("images_per_second_ci95_low")),
                                  number(row.get("images_per_second_ci95_high")))
    return found


def read_runs(folder: Path) -> dict[str, tuple[float, ...]]:
    """cell -> the images/s of each of its complete runs, from the sweep's results.csv (none where absent)."""
    path = Path(folder) / CSV_NAME
    runs: dict[str, list[float]] = {}
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row.get("images_per_second"):
                    runs.setdefault(row["cell"], []).append(float(row["images_per_second"]))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, csv.Error, KeyError, ValueError) as exc:
        raise DataError(f"{path}: not a readable sweep table ({exc})") from None
    return {cell: tuple(values) for cell, values in runs.items()}


def compare(earlier: Path, later: Path) -> tuple[list[RerunCell], list[str]]:
    """The cells both summaries measured, in the later's order, with each sweep's runs from the
    results.csv beside its summary; and the later's cells the earlier lacks."""
    before, after = read_medians(earlier), read_medians(later)
    runs_before, runs_after = read_runs(earlier.parent), read_runs(later.parent)
    both = [RerunCell(cell, before[cell][0], before[cell][1], before[cell][2], after[cell][0],
                      runs_before.get(cell, ()), runs_after.get(cell, ()))
            for cell in after if cell in before]
    return both, [cell for cell in after if cell not in before]


def write_rerun_csv(path: Path, cells: list[RerunCell]) -> None:
    write_rows(path, RERUN_FIELDS, [c.row() for c in cells])


def rerun_summary(cells: list[RerunCell], earlier: Path, missing: list[str]) -> str:
    """One line: how many cells agree, how many medians fell inside the earlier intervals, how many came
    within 5% of the earlier medians."""
    paired = [c for c in cells if c.agree is not None]
    judged = [c for c in cells if c.within is not None]
    line = (f"re-run against {earlier}: {sum(1 for c in paired if c.agree)} of {len(paired)} cells agree (the 95% "
            f"interval of the difference of the two sweeps' means holds 0), "
            f"{sum(1 for c in judged if c.within)} of {len(judged)} medians inside the earlier sweep's 95% intervals, "
            f"{sum(1 for c in cells if c.apart <= CLOSE_SHARE)} of {len(cells)} within {CLOSE_SHARE:.0%} of its medians")
    if len(judged) < len(cells):
        line += f" ({len(cells) - len(judged)} earlier cell(s) had no interval: one repeat)"
    if missing:
        line += f"; not in the earlier sweep: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
    return line


def _word(flag: bool | None) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def rerun_table(cells: list[RerunCell]) -> list[str]:
    """The cells as a Markdown table, worst first: those that disagree, then those outside their
    interval, the furthest apart first."""
    lines = ["| cell | earlier images/s | 95% interval | re-run | apart | within | difference, 95% | agree |",
             "|---|---:|---|---:|---:|---|---|---|"]
    for c in sorted(cells, key=lambda c: (c.agree is not False, c.within is not False, -c.apart)):
        interval = "-" if c.within is None else f"{c.low:,.0f}-{c.high:,.0f}"
        d = c.difference
        difference = "-" if d is None else f"{d.low:+,.0f} to {d.high:+,.0f}"
        lines.append(f"| {c.cell} | {c.earlier:,.0f} | {interval} | {c.later:,.0f} | {c.apart:.1%} | "
                     f"{_word(c.within)} | {difference} | {_word(c.agree)} |")
    return lines
