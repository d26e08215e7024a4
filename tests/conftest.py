"""Shared fixtures: tiny generated image trees. No network, no downloads."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from stallscope.tfimport import import_tensorflow

import_tensorflow()

import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import cpu_cgroup as cpu_cgroup_tool  # noqa: E402  (tools/cpu_cgroup.py: also what the benchmark and README use)


def jpeg_bytes(rng: np.random.Generator, size: tuple[int, int] = (80, 60), quality: int = 85) -> bytes:
    """A small photo-like JPEG: smooth gradients plus noise, so it compresses like a photo."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    base = rng.uniform(0, 255, 3)
    slope = rng.uniform(-2, 2, (2, 3))
    pixels = base + x[..., None] * slope[0] + y[..., None] * slope[1] + rng.normal(0, 12, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def make_image_tree(
    root: Path,
    *,
    classes: int = 3,
    per_class: int = 6,
    splits: tuple[str, ...] | None = None,
    size: tuple[int, int] = (80, 60),
    seed: int = 0,
) -> Path:
    """Writes `{label}/*.jpg` (or `{split}/{label}/*.jpg` when splits are given) under root."""
    rng = np.random.default_rng(seed)
    for split in splits or (None,):
        base = Path(root) / split if split else Path(root)
        for c in range(classes):
            folder = base / f"class_{c:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                (folder / f"img_{i:03d}.jpg").write_bytes(jpeg_bytes(rng, size))
    return Path(root)


@pytest.fixture(scope="session", autouse=True)
def temporary_folder_of_the_session(tmp_path_factory):
    """What the code under test keeps in the temporary folder on purpose (a diagnosis's profile, a
    monitor's log without log_dir) goes under the session's own folder, which pytest prunes, instead of
    staying in /tmp for good; child processes get it through TMPDIR."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = folder, folder
    yield folder
    tempfile.tempdir = saved[0]
    if saved[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[1]


REPO_RUNS = Path(__file__).resolve().parents[1] / "runs"  # where train's default run folder lands from the root


@pytest.fixture(autouse=True)
def nothing_new_in_the_repos_runs():
    """A test that trains without a log path from the repository's root writes runs/<stamp>-... there,
    which .gitignore hides: the test fails here, by name, instead (its run belongs under tmp_path). One
    listing before and after each test. Under -n, a test running beside it may be named too."""
    before = _names_in(REPO_RUNS)
    yield
    new = _names_in(REPO_RUNS) - before
    if new:
        pytest.fail(f"the test left {', '.join(sorted(new))} in the repository's runs/; give its run a folder "
                    "under tmp_path (--log_path, log_path=) or monkeypatch.chdir(tmp_path)", pytrace=False)


def _names_in(folder: Path) -> set[str]:
    try:
        return set(os.listdir(folder))
    except FileNotFoundError:
        return set()


def make_noisy_tree(root: Path, *, per_class: int = 40, seed: int = 3) -> Path:
    """`a/` and `b/` of noise JPEGs (480x360, about 160 KB each): slow enough to convert that a run can
    be stopped mid-way (three workers take a second or so for 40 a class)."""
    rng = np.random.default_rng(seed)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (360, 480, 3), dtype=np.uint8)).save(root / label / f"{i:03d}.jpg",
                                                                                      quality=90)
    return root


@pytest.fixture
def noisy_tree_factory(tmp_path):
    """Call it for a tree of noise JPEGs (see `make_noisy_tree`): `noisy_tree_factory(per_class=12)`."""
    counter = iter(range(1000))
    return lambda **kwargs: make_noisy_tree(tmp_path / f"noisy{next(counter)}", **kwargs)


@pytest.fixture
def image_tree_factory(tmp_path):
    """Call it to write a tiny tree: `image_tree_factory(classes=3, per_class=6, splits=("train",))`."""
    counter = iter(range(1000))

    def factory(**kwargs) -> Path:
        return make_image_tree(tmp_path / f"tree{next(counter)}", **kwargs)

    return factory


@pytest.fixture(scope="session")
def tiny_tree(tmp_path_factory) -> Path:
    """A shared read-only `{label}/*` tree: 3 classes x 8 JPEGs of 80x60. Do not modify it."""
    return make_image_tree(tmp_path_factory.mktemp("tiny_tree"), classes=3, per_class=8)


@pytest.fixture
def small_disk(tmp_path):
    """A folder on a 2 MB tmpfs of its own, for a full disk (mounting takes root: skipped, saying why,
    where it cannot be made), unmounted after the test."""
    import shutil
    import subprocess

    folder = tmp_path / "small-disk"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True,
                          text=True, timeout=30)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.strip() or made.returncode})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


@pytest.fixture
def cpu_cgroup():
    """A CpuCgroup, removed after the test (its processes gone or moved out by then); skipped, saying
    why, where this process may not make one (it takes root and a CPU controller)."""
    found = cpu_cgroup_tool.writable_parent()
    if found is None:
        pytest.skip("no cgroup CPU hierarchy this process may create a child in (needs root)")
    group = cpu_cgroup_tool.CpuCgroup(*found)
    try:
        yield group
    finally:
        group.remove()


@pytest.fixture
def silent_port():
    """A loopback port that accepts connections and never answers (a store or a job that hangs), for the
    test only: its connections and listener are closed after it."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


# --- Side by side (pytest-xdist's -n): `make test` runs two workers. A test whose figures depend on
# having the CPUs to itself (CPU shares, quotas, input-bound verdicts of live jobs, how soon a deadline
# fires) is marked `whole_machine`: it waits for the other worker's current test to end and holds it
# off while it runs. Every test takes the gate shared; a whole_machine test takes it exclusively first, so
# the others cannot keep it waiting for ever. Without -n there is one worker and the locks cost nothing.
# Under --dist loadscope the whole_machine tests of every file are one unit of work, handed out first
# (`pytest_xdist_make_scheduler`): one worker runs them back to back at the start, holding the machine
# from the first to the last, instead of each file's few waiting for whatever long test the other worker
# had just begun (ten such waits, a test's length each, in a run that scattered them).

def pytest_configure(config):
    config.addinivalue_line("markers", "whole_machine: runs while no other test does (pytest -n): it times or "
                                       "measures CPU use that another test beside it would skew")


WHOLE_MACHINE_UNIT = "whole_machine tests"  # the scheduler's name for the unit of them all
WHOLE_MACHINE_LIST = "whole_machine.json"    # the workers' list of them, in the folder the run shares
# Files of few tests that take 20 s or more: xdist hands out files by their number of tests, most first,
# which left these to the end, where one worker ran its last one while the other had finished (29 s for
# the emulated what-if's one test). Handed out next after the whole_machine unit instead; only an order.
LONG_FEW = ("tests/analysis/test_storage_whatif_emulated.py", "tests/sweep/test_store_axis.py",
            "tests/faults/test_service.py", "tests/service/test_lifetimes.py", "tests/storage/test_stuck_calls.py")


def pytest_collection_modifyitems(config, items):
    """A test under a CPU quota of its own (the cpu_cgroup fixture) measures its throttling: whole_machine.
    A worker of pytest -n writes the node ids of the whole_machine tests for the scheduler (each worker
    collects the same tests, so either's list will do)."""
    for item in items:
        if "cpu_cgroup" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.whole_machine)
    folder = _machine_lock_folder(config)
    if folder is not None:
        mine = folder / f"{WHOLE_MACHINE_LIST}.{os.environ['PYTEST_XDIST_WORKER']}"
        mine.write_text(json.dumps([item.nodeid for item in items if _whole_machine(item)]))
        os.replace(mine, folder / WHOLE_MACHINE_LIST)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown where xdist is not loaded
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope, with the whole_machine tests of every file taken out of their files' units into
    one unit, which the first worker to ask for work gets (see above), then the LONG_FEW files; every
    other file stays one unit, its module fixtures made once. Other --dist modes are xdist's own."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WholeMachineFirst(LoadScopeScheduling):
        whole_machine: set | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.whole_machine is None:  # asked once every worker has collected, so their list is there
                listed = Path(config._tmp_path_factory.getbasetemp()) / WHOLE_MACHINE_LIST  # noqa: SLF001
                self.whole_machine = set(json.loads(listed.read_text())) if listed.exists() else set()
            return WHOLE_MACHINE_UNIT if nodeid in self.whole_machine else super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            for scope in reversed((WHOLE_MACHINE_UNIT, *LONG_FEW)):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return WholeMachineFirst(config, log)


def _machine_lock_folder(config) -> Path | None:
    """The folder every worker of this run shares (the parent of each worker's base temp), or None
    when the run has no workers."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return Path(config._tmp_path_factory.getbasetemp()).parent  # noqa: SLF001 - pytest's own factory


def _whole_machine(item) -> bool:
    return item is not None and item.get_closest_marker("whole_machine") is not None


_HELD: list = []  # the gate and lock files, held exclusively from one whole_machine test into the next
_STARTED: list = []  # one entry once this worker has run a test
FIRST_WAIT_S = 3.0   # how long the first shared test of a worker lets the whole_machine unit go first


def _let_the_whole_machine_unit_start(folder: Path, gate) -> None:
    """Both workers start at once, one with the whole_machine unit (see above): a shared test that took
    the gate first would keep that unit, and so both workers, waiting for its whole length. The first
    shared test of a worker waits (up to FIRST_WAIT_S) for the other to take the gate, where the run has
    whole_machine tests."""
    import fcntl
    import time

    _STARTED.append(True)
    listed = folder / WHOLE_MACHINE_LIST
    if not listed.exists() or not json.loads(listed.read_text()):
        return
    deadline = time.monotonic() + FIRST_WAIT_S
    while time.monotonic() < deadline:
        try:
            fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # taken exclusively: the unit has started
        fcntl.flock(gate, fcntl.LOCK_UN)
        time.sleep(0.05)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of each test inside the machine lock (see above). A whole_machine test
    followed by another in this worker (a module of them: capture's live jobs) keeps the machine for it:
    handing it over between them would let the other worker start a test of a minute that the next one
    waits for, its live jobs stepping all the while."""
    import fcntl

    folder = _machine_lock_folder(item.config)
    if folder is None:
        return (yield)
    exclusive = _whole_machine(item)
    if exclusive:
        _STARTED.append(True)
    if _HELD and not exclusive:  # not expected (the last one looked ahead), but never hold it for a shared test
        _release(*_HELD)
        _HELD.clear()
    if _HELD:
        gate, lock = _HELD
        _HELD.clear()
    else:
        gate, lock = open(folder / "machine.gate", "a+"), open(folder / "machine.lock", "a+")
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            if not _STARTED:
                _let_the_whole_machine_unit_start(folder, gate)
            fcntl.flock(gate, fcntl.LOCK_SH)   # waits while a whole_machine test is waiting or running
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
    keep = False
    try:
        result = yield
        keep = exclusive and _whole_machine(nextitem)
        return result
    finally:
        if keep:
            _HELD.extend((gate, lock))
        else:
            _release(gate, lock)


def _release(gate, lock) -> None:
    import fcntl

    fcntl.flock(lock, fcntl.LOCK_UN)
    fcntl.flock(gate, fcntl.LOCK_UN)
    lock.close()
    gate.close()


# --- The fault-injection suite's fixture (`faults`): every scenario runs the real CLI through
# `faults/harness.Launched`; its Outcome's row (scenario, exit code, lines, traceback, seconds, orphans)
# goes into the test's report, and the table of every row is printed at the end of the session: "0
# tracebacks, 0 hangs, 0 orphans" is one run. The rows travel in the reports, so the table is whole when
# pytest -n runs the tests in workers. Most scenarios are in tests/faults; a few use another folder's
# set-up (checkpoints, a finished sweep).
from .faults.harness import Launched, Outcome  # noqa: E402

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


# --- The fault-injection table (tests/faults): each scenario's row comes in its test's report, from
# this process or from a worker of pytest -n, and the table is the last thing the session prints.
FAULT_ROWS: list[dict] = []


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        FAULT_ROWS.extend(value for name, value in report.user_properties if name == OUTCOME_PROPERTY)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not FAULT_ROWS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("fault injection")
    width = max(len(row["scenario"]) for row in FAULT_ROWS)
    write(f"{'scenario':<{width}}  {'rc':>5}  {'stderr':>6}  {'stdout':>6}  {'traceback':>9}  {'seconds':>7}  orphans")
    for row in FAULT_ROWS:
        rc = "hang" if row["rc"] is None else str(row["rc"])
        write(f"{row['scenario']:<{width}}  {rc:>5}  {row['stderr_lines']:>6}  {row['stdout_lines']:>6}  "
              f"{'yes' if row['traceback'] else 'no':>9}  {row['seconds']:>7.1f}  {row['orphans']}")
    hangs = sum(row["rc"] is None for row in FAULT_ROWS)
    write(f"{len(FAULT_ROWS)} runs: {sum(row['traceback'] for row in FAULT_ROWS)} tracebacks, {hangs} hangs, "
          f"{sum(row['orphans'] for row in FAULT_ROWS)} orphans")
