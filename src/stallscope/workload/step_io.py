"""Requests and bytes per training step, from the best counter the run has.

Each step reads three counters at its start and end (about 20 us in all): the emulated store's own
(where the data is on `stallscope storage serve` and its counters can be read), stallscope's reader's
tally (its gs:// and s3:// requests in this process) and this process's read calls and bytes from
`/proc/self/io`. When the run is over, the best that moved names the run's basis:

- "store": requests the store served and bytes it sent, whichever client asked (TF's gs://, s3fs,
  obstore, a FUSE mount's kernel);
- "reader": requests stallscope's own reader made and bytes it received;
- "process": read calls and bytes read by this process (local files: the page cache included, so a
  warm cache still counts its bytes; everything the process read, not only the data).

A step's figures are what was asked for while it ran, read-ahead for later steps included: the
pipeline fetches ahead, so a step's requests are not its own batch's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from stallscope.storage import request_tally
from stallscope.workload.resources import read_proc_io
from stallscope.workload.rundir import StepRecord

BASES = ("store", "reader", "process")
BASIS_MEANING = {
    "store": "requests the store served and bytes it sent while the step ran (read-ahead included)",
    "reader": "requests stallscope's reader made and bytes it received while the step ran (read-ahead included)",
    "process": "read calls and bytes read by this process while the step ran (page-cache hits included)",
}

Counts = tuple[int, int]  # (requests, bytes), cumulative


def _process_counts() -> Counts | None:
    io = read_proc_io()
    return None if io is None else (int(io.get("syscr", 0)), int(io.get("rchar", 0)))


def _reader_counts() -> Counts:
    return request_tally.counts()


@dataclasses.dataclass(frozen=True)
class StepIo:
    """One step's (requests, bytes) by each basis; None where that counter could not be read."""

    store: Counts | None
    reader: Counts | None
    process: Counts | None


class StepIoCounter:
    """Takes the counters at a step's start and end (`start`, `stop`) and keeps each step's difference;
    `begin` and `end` take them around the whole run (its read-ahead abandoned at the end included,
    when `end` comes after the pipeline's iterators are gone). `store`: a call returning the emulated
    store's cumulative (requests, bytes), or None."""

    def __init__(self, store: Callable[[], Counts] | None = None) -> None:
        self._readers = {"store": store, "reader": _reader_counts, "process": _process_counts}
        self._at_start: dict[str, Counts | None] = {}
        self._at_begin: dict[str, Counts | None] = {}
        self.steps: list[StepIo] = []
        self.run: StepIo | None = None

    def begin(self) -> None:
        self._at_begin = self._read()

    def end(self) -> None:
        self.run = self._difference(self._at_begin, self._read())

    def _read(self) -> dict[str, Counts | None]:
        values = {}
        for name, read in self._readers.items():
            try:
                values[name] = read() if read is not None else None
            except (OSError, ValueError):  # a store gone mid-run: that basis stops counting
                values[name] = None
        return values

    def start(self) -> None:
        self._at_start = self._read()

    def stop(self) -> None:
        self.steps.append(self._difference(self._at_start, self._read()))

    @staticmethod
    def _difference(before: dict[str, Counts | None], after: dict[str, Counts | None]) -> StepIo:
        def delta(name: str) -> Counts | None:
            first, last = before.get(name), after.get(name)
            if first is None or last is None:
                return None
            return last[0] - first[0], last[1] - first[1]

        return StepIo(*(delta(name) for name in BASES))

    def basis(self) -> str | None:
        """The best basis that counted every step and saw any request; None without steps."""
        return best_basis(self.steps)

    def annotate(self, records: list[StepRecord]) -> list[StepRecord]:
        """The records with each step's requests and bytes on the run's basis (as they were without one)."""
        basis = self.basis()
        if basis is None or len(records) != len(self.steps):
            return records
        return [dataclasses.replace(record, requests=counts[0], bytes_read=counts[1])
                for record, counts in zip(records, (getattr(s, basis) for s in self.steps))]

    def run_totals(self) -> Counts | None:
        """(requests, bytes) of the whole run on its basis: warm-up and the read-ahead abandoned at the
        end included; None without a basis."""
        basis = self.basis()
        if basis is None or self.run is None:
            return None
        return getattr(self.run, basis)


def best_basis(steps: Sequence[StepIo]) -> str | None:
    for name in BASES:
        values = [getattr(s, name) for s in steps]
        if values and all(v is not None for v in values) and any(v[0] for v in values):
            return name
    return None
