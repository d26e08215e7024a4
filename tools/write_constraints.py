"""Write constraints.txt from a `pip install --dry-run --report` resolution.

Why: `make venv` installs with these pins so a fresh machine gets the one set the suite was run with,
and pip does not have to search the object-store packages' release history (it gives up there).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = """\
# The exact set `make venv` installs for the cpu and test extras: one resolution, tested together.
# Without it pip gives up on a fresh machine (resolution-too-deep); with it, it resolves at once.
# pyproject.toml keeps the ranges users install from. Refresh with `make constraints` after changing
# dependencies (it starts from what .venv has), then run `make test` before committing the file.
"""


def main(report_path: str, out_path: str) -> None:
    report = json.loads(Path(report_path).read_text())
    pins = sorted(
        (item["metadata"]["name"], item["metadata"]["version"])
        for item in report["install"]
        if item["metadata"]["name"] != "stallscope"
    )
    pins.sort(key=lambda pin: pin[0].lower())
    body = "".join(f"{name}=={version}\n" for name, version in pins)
    Path(out_path).write_text(HEADER + body)
    print(f"{out_path}: {len(pins)} pins")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: write_constraints.py RESOLUTION.json CONSTRAINTS.txt")
    main(sys.argv[1], sys.argv[2])
