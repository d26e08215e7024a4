"""The fault-injection suite's fixture (`faults`).

Every scenario runs the real CLI through `harness.Launched`; its Outcome's row (scenario, exit code,
lines, traceback, seconds, orphans) goes into the test's report, and tests/conftest.py prints the table
of every row at the end of the session: "0 tracebacks, 0 hangs, 0 orphans" is one run of tests/faults.
The rows travel in the reports so the table is whole when pytest -n runs the tests in workers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Launched, Outcome

OUTCOME_PROPERTY = "fault_outcome"  # the name tests/conftest.py looks for in each report's user_properties


def table_row(outcome: Outcome) -> dict:
    return {"scenario": outcome.scenario, "rc": outcome.rc, "stderr_lines": len(outcome.stderr_lines),
            "stdout_lines": len(outcome.stdout_lines), "traceback": outcome.traceback,
            "seconds": outcome.seconds, "orphans": len(outcome.orphans)}


class Faults:
    """`faults.launch(name, argv, ...)` starts `stallscope *argv` under watch, in the test's folder."""

    def __init__(self, folder: Path, node: pytest.Item) -> None:
        self.folder, self._node = folder, node

    def _record(self, outcome: Outcome) -> None:
        self._node.user_properties.append((OUTCOME_PROPERTY, table_row(outcome)))

    def launch(self, scenario: str, argv: list, **kwargs) -> Launched:
        return Launched(scenario, argv, self.folder, self._record, **kwargs)

    def run(self, scenario: str, argv: list, limit_s: float, **kwargs) -> Outcome:
        """Launches and waits for the end: a scenario that fails by itself."""
        return self.launch(scenario, argv, **kwargs).finish(limit_s)


@pytest.fixture
def faults(tmp_path, request) -> Faults:
    return Faults(tmp_path, request.node)
