"""The progress bar of the long-running subcommands (prepare, convert)."""

from __future__ import annotations

import sys


class ProgressBar:
    """A tqdm bar on stderr, created on the first report (when the total is known); nothing at all
    when stderr is not a terminal or the bar is disabled. Use it as a context manager.

    Called as `bar(amount, total, unit)` with the amount just finished (the data modules' progress
    sinks), or `bar.to(done, total)` with the amount done so far (the converter's).
    """

    def __init__(self, description: str, *, enabled: bool = True) -> None:
        self._description = description
        self._enabled = enabled and sys.stderr.isatty()
        self._bar = None

    def __call__(self, amount: int, total: int | None, unit: str = "img") -> None:
        if not self._enabled:
            return
        if self._bar is None:
            from tqdm import tqdm

            scale = unit == "B"
            self._bar = tqdm(total=total, desc=self._description, unit=unit, unit_scale=scale,
                             unit_divisor=1024 if scale else 1000, leave=False, dynamic_ncols=True,
                             file=sys.stderr)
        self._bar.update(amount)

    @property
    def enabled(self) -> bool:
        """False when nothing will be shown: a caller can skip the work of counting."""
        return self._enabled

    def to(self, done: int, total: int) -> None:
        self(done - (self._bar.n if self._bar is not None else 0), total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
