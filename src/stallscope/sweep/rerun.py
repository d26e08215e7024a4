"""A sweep run again beside an earlier one (`sweep --against EARLIER`): whether each cell's re-run falls
in the interval the earlier sweep stated for a re-run, whether the two sweeps' repeats agree (the 95%
Welch interval of the difference of their means holds 0), how far their means are apart, and whether a
whole store moved between the sweeps. It answers the question a reviewer asks of a figure, "does it
hold when you run it again?", from the two sweeps' summary.csv and results.csv files.

The earlier interval a re-run is judged by is its re-run interval (a prediction interval of the
geometric mean, sweep/interval.py), not the interval of its own mean: a re-run's mean falls inside the
latter less often than 95% even where nothing changed (about 83% for many repeats).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from pathlib import Path

from stallscope.errors import DataError
from stallscope.sweep.figures import STORE_LABELS
from stallscope.sweep.interval import Interval, difference_interval, log_interval, t_interval
from stallscope.sweep.pooled_variance import fit_prior, log_variance
from stallscope.sweep.table import CSV_NAME, SUMMARY_NAME, write_rows

RERUN_NAME = "rerun.csv"
RERUN_FIELDS = ("cell", "store", "earlier_images_per_second_median", "earlier_images_per_second_geometric_mean",
                "earlier_rerun95_low", "earlier_rerun95_high",
                "images_per_second_median", "images_per_second_geometric_mean", "within_rerun_interval", "apart_pct",
                "difference_ci95_low", "difference_ci95_high", "agree")
CLOSE_SHARE = 0.05  # two means this close (of the earlier) are counted apart from the intervals' verdicts


def geometric_mean(runs: tuple[float, ...], otherwise: float) -> float:
    """The geometric mean of the positive runs; `otherwise` (a median) where there are none."""
    positive = [r for r in runs if r > 0]
    return math.exp(statistics.fmean(math.log(r) for r in positive)) if positive else otherwise


@dataclasses.dataclass(frozen=True)
class RerunCell:
    """One cell of both sweeps: the earlier median and re-run interval, the later median, both sweeps' runs."""

    cell: str
    earlier: float
    low: float | None    # the earlier sweep's re-run interval (None: it had one repeat)
    high: float | None
    later: float
    earlier_runs: tuple[float, ...] = ()
    later_runs: tuple[float, ...] = ()
    store: str | None = None

    @property
    def later_mean(self) -> float:
        """What the re-run interval predicts: the later runs' geometric mean (the median without runs)."""
        return geometric_mean(self.later_runs, self.later)

    @property
    def earlier_mean(self) -> float:
        return geometric_mean(self.earlier_runs, self.earlier)

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
        """Whether the re-run fell in the earlier re-run interval; None where that had none (one repeat)."""
        if self.low is None or self.high is None:
            return None
        return self.low <= self.later_mean <= self.high

    @property
    def apart(self) -> float:
        """The later geometric mean's distance from the earlier, as a share of the earlier."""
        return abs(self.later_mean - self.earlier_mean) / self.earlier_mean if self.earlier_mean > 0 else float("inf")

    def row(self) -> dict[str, object]:
        d = self.difference
        return {"cell": self.cell, "store": self.store, "earlier_images_per_second_median": self.earlier,
                "earlier_images_per_second_geometric_mean": self.earlier_mean,
                "earlier_rerun95_low": self.low, "earlier_rerun95_high": self.high,
                "images_per_second_median": self.later, "images_per_second_geometric_mean": self.later_mean,
                "within_rerun_interval": self.within, "apart_pct": self.apart * 100.0,
                "difference_ci95_low": d.low if d else None, "difference_ci95_high": d.high if d else None,
                "agree": self.agree}


@dataclasses.dataclass(frozen=True)
class StoreShift:
    """How far one store's cells moved between the sweeps together: the geometric mean of the cells'
    later/earlier ratios less one, with a 95% t-interval over the cells (None with one cell)."""

    store: str
    cells: int
    shift: float
    interval: Interval | None

    @property
    def moved(self) -> bool:
        """The interval excludes no change: the store as a whole was faster or slower the second time."""
        return self.interval is not None and not self.interval.low <= 0.0 <= self.interval.high


def summary_path(folder: Path) -> Path:
    """The summary.csv of a sweep folder, or a one-line error naming what is missing."""
    path = Path(folder) / SUMMARY_NAME
    if not path.is_file():
        raise DataError(f"--against: expected a sweep folder holding {SUMMARY_NAME}, got {str(folder)!r} without one")
    return path


def _number(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def read_medians(path: Path) -> dict[str, tuple[float, float | None, float | None]]:
    """cell -> (images/s median, re-run interval low, high) of each cell with a complete run; the
    interval is None where the summary states none (one repeat, or a sweep from before re-run intervals)."""
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
        median = _number(row.get("images_per_second_median"))
        if median is not None:
            found[row["cell"]] = (median, _number(row.get("images_per_second_rerun95_low")),
                                  _number(row.get("images_per_second_rerun95_high")))
    return found


def read_runs(folder: Path) -> tuple[dict[str, tuple[float, ...]], dict[str, str]]:
    """(cell -> the images/s of each of its complete runs, cell -> its store) from the sweep's
    results.csv (both empty where it is absent)."""
    path = Path(folder) / CSV_NAME
    runs: dict[str, list[float]] = {}
    stores: dict[str, str] = {}
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row.get("images_per_second"):
                    runs.setdefault(row["cell"], []).append(float(row["images_per_second"]))
                    if row.get("store"):
                        stores[row["cell"]] = row["store"]
    except FileNotFoundError:
        return {}, {}
    except (OSError, UnicodeDecodeError, csv.Error, KeyError, ValueError) as exc:
        raise DataError(f"{path}: not a readable sweep table ({exc})") from None
    return {cell: tuple(values) for cell, values in runs.items()}, stores


def _rerun_intervals(runs: dict[str, tuple[float, ...]]) -> dict[str, Interval]:
    """The re-run interval of each cell, as `sweep` states it, for a summary from before it did."""
    prior = fit_prior([log_variance(values) for values in runs.values()])
    found = {}
    for cell, values in runs.items():
        interval = log_interval(list(values), prior=prior, rerun_repeats=len(values))
        if interval is not None:
            found[cell] = interval
    return found


def compare(earlier: Path, later: Path) -> tuple[list[RerunCell], list[str]]:
    """The cells both summaries measured, in the later's order, with each sweep's runs from the
    results.csv beside its summary; and the later's cells the earlier lacks."""
    before, after = read_medians(earlier), read_medians(later)
    (runs_before, _), (runs_after, stores) = read_runs(earlier.parent), read_runs(later.parent)
    computed = _rerun_intervals(runs_before) if any(low is None for _, low, _ in before.values()) else {}
    both = []
    for cell in after:
        if cell not in before:
            continue
        median, low, high = before[cell]
        if low is None and cell in computed:
            low, high = computed[cell].low, computed[cell].high
        both.append(RerunCell(cell, median, low, high, after[cell][0], runs_before.get(cell, ()),
                              runs_after.get(cell, ()), stores.get(cell)))
    return both, [cell for cell in after if cell not in before]


def store_shifts(cells: list[RerunCell]) -> list[StoreShift]:
    """Each store's cells' common move between the sweeps, in the order the stores first appear."""
    ratios: dict[str, list[float]] = {}
    for c in cells:
        if c.store and c.earlier_runs and c.later_runs:
            ratios.setdefault(c.store, []).append(math.log(c.later_mean / c.earlier_mean))
    shifts = []
    for store, logs in ratios.items():
        interval = t_interval(logs)
        shifts.append(StoreShift(store=store, cells=len(logs), shift=math.expm1(statistics.fmean(logs)),
                                 interval=None if interval is None else Interval(
                                     mean=math.expm1(interval.mean), low=math.expm1(interval.low),
                                     high=math.expm1(interval.high), n=interval.n)))
    return shifts


def write_rerun_csv(path: Path, cells: list[RerunCell]) -> None:
    write_rows(path, RERUN_FIELDS, [c.row() for c in cells])


def movement_text(shift: StoreShift) -> str:
    """'1.8% slower (95%: -2.7% to -0.9%, 10 cells)'."""
    way = f"{abs(shift.shift):.1%} {'faster' if shift.shift > 0 else 'slower'}"
    if shift.interval is None:
        return f"{way} (1 cell)"
    return f"{way} (95%: {shift.interval.low:+.1%} to {shift.interval.high:+.1%}, {shift.cells} cells)"


def shift_text(shift: StoreShift) -> str:
    """'gs:// 1.8% slower (95%: -2.7% to -0.9%, 10 cells)'."""
    return f"{STORE_LABELS.get(shift.store, shift.store)} {movement_text(shift)}"


def rerun_summary(cells: list[RerunCell], earlier: Path, missing: list[str]) -> str:
    """One line: how many re-runs fell in the earlier re-run intervals, how many cells agree, how many
    came within 5% of the earlier (geometric means: what the interval predicts), and the stores that moved
    as a whole."""
    judged = [c for c in cells if c.within is not None]
    paired = [c for c in cells if c.agree is not None]
    line = (f"re-run against {earlier}: {sum(1 for c in judged if c.within)} of {len(judged)} cells inside the "
            f"earlier sweep's 95% re-run intervals, {sum(1 for c in paired if c.agree)} of {len(paired)} agree "
            f"(the 95% interval of the difference of the two sweeps' means holds 0), "
            f"{sum(1 for c in cells if c.apart <= CLOSE_SHARE)} of {len(cells)} within {CLOSE_SHARE:.0%} of its means")
    if len(judged) < len(cells):
        line += f" ({len(cells) - len(judged)} earlier cell(s) had no interval: one repeat)"
    moved = [s for s in store_shifts(cells) if s.moved]
    if moved:
        line += "; moved as a whole: " + ", ".join(shift_text(s) for s in moved)
    if missing:
        line += f"; not in the earlier sweep: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
    return line


def _word(flag: bool | None) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def rerun_table(cells: list[RerunCell]) -> list[str]:
    """The cells as a Markdown table, worst first: those outside their re-run interval, then those that
    disagree, the furthest apart first; then one row per store's move."""
    lines = ["| cell | earlier images/s | re-run 95% | re-run images/s | apart | within | difference, 95% | agree |",
             "|---|---:|---|---:|---:|---|---|---|"]
    for c in sorted(cells, key=lambda c: (c.within is not False, c.agree is not False, -c.apart)):
        interval = "-" if c.within is None else f"{c.low:,.0f}-{c.high:,.0f}"
        d = c.difference
        difference = "-" if d is None else f"{d.low:+,.0f} to {d.high:+,.0f}"
        lines.append(f"| {c.cell} | {c.earlier_mean:,.0f} | {interval} | {c.later_mean:,.0f} | {c.apart:.1%} | "
                     f"{_word(c.within)} | {difference} | {_word(c.agree)} |")
    shifts = store_shifts(cells)
    if shifts:
        lines += ["", "| store | cells | the second time |", "|---|---:|---|"]
        lines += [f"| {STORE_LABELS.get(s.store, s.store)} | {s.cells} | {movement_text(s)} |"
                  for s in shifts]
    return lines
