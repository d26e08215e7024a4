"""The fault-injection suite's fixture (`faults`) and its table at the end of the session.

Every scenario runs the real CLI through `harness.Launched`; its Outcome is kept for the session, and
when any faults test ran, the table (scenario, exit code, lines, traceback, seconds, orphans) is the
last thing pytest prints: "0 tracebacks, 0 hangs, 0 orphans" is one run of tests/faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Launched, Outcome

OUTCOMES = pytest.StashKey[list]()


def _outcomes(config) -> list[Outcome]:
    if OUTCOMES not in config.stash:
        config.stash[OUTCOMES] = []
    return config.stash[OUTCOMES]


class Faults:
    """`faults.launch(name, argv, ...)` starts `stallscope *argv` under watch, in the test's folder."""

    def __init__(self, folder: Path, outcomes: list[Outcome]) -> None:
        self.folder, self._outcomes = folder, outcomes

    def launch(self, scenario: str, argv: list, **kwargs) -> Launched:
        return Launched(scenario, argv, self.folder, self._outcomes.append, **kwargs)

    def run(self, scenario: str, argv: list, limit_s: float, **kwargs) -> Outcome:
        """Launches and waits for the end: a scenario that fails by itself."""
        return self.launch(scenario, argv, **kwargs).finish(limit_s)


@pytest.fixture
def faults(tmp_path, request) -> Faults:
    return Faults(tmp_path, _outcomes(request.config))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    outcomes = config.stash.get(OUTCOMES, [])
    if not outcomes:
        return
    write = terminalreporter.write_line
    terminalreporter.section("fault injection")
    width = max(len(o.scenario) for o in outcomes)
    write(f"{'scenario':<{width}}  {'rc':>5}  {'stderr':>6}  {'stdout':>6}  {'traceback':>9}  {'seconds':>7}  orphans")
    for o in outcomes:
        rc = "hang" if o.rc is None else str(o.rc)
        write(f"{o.scenario:<{width}}  {rc:>5}  {len(o.stderr_lines):>6}  {len(o.stdout_lines):>6}  "
              f"{'yes' if o.traceback else 'no':>9}  {o.seconds:>7.1f}  {len(o.orphans)}")
    hangs = sum(o.rc is None for o in outcomes)
    write(f"{len(outcomes)} runs: {sum(o.traceback for o in outcomes)} tracebacks, {hangs} hangs, "
          f"{sum(len(o.orphans) for o in outcomes)} orphans")
