"""Captures analysed: a running job's profile taken by `stallscope capture` (once, or again and again
with --watch), and the window of `stallscope.profile(...)`, whose `.analyze()` is the analysis of its
own capture. Capturing is the workload's (workload/capture.py, workload/marking.py); reading what was
captured is analysis'.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stallscope.analysis.analyze import analyze_run
from stallscope.errors import StallscopeError, UsageError
from stallscope.workload import marking
from stallscope.workload.capture import CaptureOptions, NoSteps, capture


@dataclasses.dataclass(frozen=True)
class CaptureSummary:
    """One capture of a watch, as numbers: what the one-line report shows."""

    time: str                 # local time the capture ended, ISO 8601
    capture: str              # its directory
    steps: int                # counted steps
    step_ms: float | None     # mean step time
    input_share: float | None
    verdict: str | None
    bottleneck: str | None
    error: str | None = None  # why this window has no figures (the job answered but ran no steps)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(analysis: Any, capture_dir: Path, when: datetime.datetime) -> CaptureSummary:
    """The watch line's figures from an `Analysis`."""
    return CaptureSummary(
        time=when.isoformat(timespec="seconds"), capture=str(capture_dir), steps=analysis.steps.counted_steps,
        step_ms=analysis.steps.step_ms.mean, input_share=analysis.input_share, verdict=analysis.verdict,
        bottleneck=analysis.bottleneck,
    )


def capture_and_analyze(options: CaptureOptions, *, with_xprof: bool = True):
    """One capture, analysed like `stallscope analyze`; (capture dir, Analysis). A window that the
    analysis finds nothing in raises NoSteps naming the capture, which is kept."""
    capture_dir = capture(options)
    try:
        return capture_dir, analyze_run(capture_dir, with_xprof=with_xprof)
    except StallscopeError as exc:
        raise NoSteps(f"{options.display}: nothing to analyse in the {options.duration_s:g}s capture: {exc}") from None


def watch(options: CaptureOptions, *, interval_s: float, count: int | None = None) -> Iterator[CaptureSummary]:
    """Captures every interval_s (start to start) and yields one summary per capture, `count` times
    or until interrupted. A window without steps is yielded with its error; a job that no longer
    answers raises JobUnreachable."""
    if not interval_s > 0:
        raise UsageError(f"--interval: expected a time above 0, got {interval_s!r}s")
    done = 0
    while count is None or done < count:
        began = time.monotonic()
        try:
            capture_dir, analysis = capture_and_analyze(options, with_xprof=False)
            yield summarize(analysis, capture_dir, datetime.datetime.now().astimezone())
        except NoSteps as exc:
            yield CaptureSummary(time=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                                 capture="", steps=0, step_ms=None, input_share=None, verdict=None,
                                 bottleneck=None, error=str(exc))
        done += 1
        if count is None or done < count:
            time.sleep(max(0.0, interval_s - (time.monotonic() - began)))


class Profile(marking.Profile):
    """What `stallscope.profile` returns: the window of `stallscope.step`s to capture, and its analysis."""

    def analyze(self):
        """The `Analysis` `stallscope analyze` computes, of this window's own capture and CPU figures
        (its capture folder), whatever later windows wrote to the same LOG_DIR."""
        if self.captured_steps == 0 or self.profiler.capture is None:
            raise UsageError(f"stallscope.profile: no step of the window {self.profiler.window.text} ran; "
                             "nothing was captured")
        return analyze_run(self.profiler.capture)
