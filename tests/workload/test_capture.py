"""`stallscope capture HOST:PORT` against real training programs (tests/workload/live_job.py) that
serve their profiler: reports, --watch lines, and the one-line errors of jobs that cannot be captured."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.cli.main import main
from stallscope.errors import UsageError
from stallscope.workload.capture import STAGING_PREFIX, CaptureOptions

# Live jobs' verdicts (a healthy job must read as not input-bound): a test beside it would stall them.
pytestmark = pytest.mark.whole_machine

LIVE_JOB = Path(__file__).with_name("live_job.py")
FIT_JOB = Path(__file__).with_name("fit_job.py")
JOB_SECONDS = 900      # the job's own bound past the module's run (under pytest -n its whole_machine tests may
                       # wait minutes for the lock); the module's tests end it earlier by its stop file
READY_SECONDS = 120    # how long a job may take to import TF and run its first steps


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LiveJob:
    """A live_job.py subprocess: its address, its own step timing, stopped by its stop file or PID."""

    def __init__(self, folder: Path, *flags: str, program: Path = LIVE_JOB) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.timing = folder / "timing.jsonl"
        self.stop_file = folder / "stop"
        self.start_file = folder / "start"
        self.process = subprocess.Popen(
            [sys.executable, str(program), "--port", str(self.port), "--timing", str(self.timing),
             "--seconds", str(JOB_SECONDS), "--stop-file", str(self.stop_file), *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def steps(self) -> dict[int, float]:
        if not self.timing.exists():
            return {}
        lines = self.timing.read_text().splitlines()
        return {row["step"]: row["step_ms"] for row in map(json.loads, lines[:-1] if lines else lines)}

    def wait_until_listening(self) -> None:
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"the live job did not serve its profiler on port {self.port}")

    def wait_until_idle(self) -> None:
        """Until the job (run with --idle-file FOLDER/idle) has built everything and sits without steps."""
        self.wait_until_listening()
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            if (self.start_file.parent / "idle").exists():
                return
            time.sleep(0.1)
        raise AssertionError(f"the live job did not settle idle (exit code {self.process.poll()})")

    def wait_until_stepping(self, steps: int = 20) -> None:
        self.wait_until_listening()
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            if len(self.steps()) >= steps:
                return
            time.sleep(0.2)
        raise AssertionError(f"the live job ran {len(self.steps())} steps (exit code {self.process.poll()})")

    def end(self) -> None:
        self.stop_file.touch()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, 9)
            self.process.wait()


# The healthy job's steps end in a 150 ms emulated device wait: its cached, prefetched batches are ready long
# before each step asks, and the few ms a loaded 2-core machine makes a get_next wait for a core stay near
# 1% of a step, not the 5% of "moderately" (its bare step of a few ms made any such wait count). Its
# captures are long enough for 20-odd such steps.
HEALTHY_DEVICE_MS = 150
HEALTHY_CAPTURE = "5s"


@pytest.fixture(scope="module")
def live_jobs(tmp_path_factory):
    """The module's live jobs, started side by side (each takes seconds to import TF and build its model,
    which they overlap): healthy, stalled, and a Keras fit under steps_per_execution that waits on its
    start file, costing nothing until its test starts it."""
    jobs = {}
    try:
        jobs["healthy"] = LiveJob(tmp_path_factory.mktemp("healthy_job"), "--device-ms", str(HEALTHY_DEVICE_MS))
        jobs["stalled"] = LiveJob(tmp_path_factory.mktemp("stalled_job"), "--stalled")
        fit = tmp_path_factory.mktemp("fit_job")
        jobs["fit"] = LiveJob(fit, "--per-step", "4", "--start-file", str(fit / "start"), program=FIT_JOB)
        yield jobs
    finally:
        for job in jobs.values():
            job.end()


@pytest.fixture(scope="module")
def healthy_job(live_jobs):
    live_jobs["healthy"].wait_until_stepping()
    return live_jobs["healthy"]


@pytest.fixture(scope="module")
def stalled_job(live_jobs):
    live_jobs["stalled"].wait_until_stepping()
    return live_jobs["stalled"]


def assert_step_time_agrees(data: dict, job: LiveJob) -> None:
    """The profile's step time against the program's own wall-clock time of the same steps."""
    counted = [step["step"] for step in data["steps"]["per_step"] if step["counted"]]
    assert len(counted) >= 10
    own = job.steps()
    own_mean = sum(own[step] for step in counted) / len(counted)
    assert data["steps"]["step_ms"]["mean"] == pytest.approx(own_mean, rel=0.10)


def one_error_line(captured) -> str:
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_a_healthy_job_is_captured_and_reported_as_analyze_does(healthy_job, tmp_path, capsys):
    log_path = tmp_path / "captures"
    assert main(["capture", healthy_job.address, "--duration", HEALTHY_CAPTURE, "--log_path", str(log_path),
                 "--no-xprof"]) == 0
    out = capsys.readouterr().out
    captures = sorted((log_path / "plugins" / "profile").iterdir())
    assert len(captures) == 1 and list(captures[0].glob("*.xplane.pb"))
    assert f"into {captures[0]}" in out
    assert f"stallscope analyze {captures[0]}" in out           # analyze's own report follows
    assert "not input-bound" in out and "Fix: none needed" in out
    assert not list(log_path.glob(f"{STAGING_PREFIX}*"))

    assert main(["analyze", str(captures[0]), "--json", "--no-xprof"]) == 0
    assert_step_time_agrees(json.loads(capsys.readouterr().out), healthy_job)


def test_a_stalled_job_is_input_bound_with_the_map_named(stalled_job, tmp_path, capsys):
    args = ["capture", stalled_job.address, "--duration", "2s", "--log_path", str(tmp_path), "--json", "--no-xprof"]
    assert main(args) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert "captured 2s from" in captured.err
    assert data["verdict"] == "highly"
    assert data["bottleneck"] == "Map"
    assert {"map_parallelism": -1} in [a["knobs"] for a in data["advice"]]   # fixes ranked by predicted gain
    assert_step_time_agrees(data, stalled_job)


def test_a_fit_under_steps_per_execution_is_counted_in_batches_per_step_as_analyze_counts_them(live_jobs, tmp_path,
                                                                                              capsys):
    """A Keras fit with steps_per_execution=4 and no marker of stallscope's: the capture finds Keras' calls
    of its train function, each fetching 4 batches. It said 1 batch per step (74.8 ms "steps" with 148
    iterator calls over 37 of them) where analyze said 4; the batches of a step are its iterator calls."""
    job = live_jobs["fit"]
    job.start_file.touch()
    try:
        job.wait_until_stepping(steps=10)
        assert main(["capture", job.address, "--duration", "1s", "--log_path", str(tmp_path / "captures"),
                     "--no-xprof", "--json"]) == 0
    finally:
        job.end()
    data = json.loads(capsys.readouterr().out)
    steps = data["steps"]
    assert "multi_step_on_iterator" in steps["found_by"], steps["found_by"]
    counted = [step for step in steps["per_step"] if step["counted"]]
    assert len(counted) >= 3 and all(step["get_next_calls"] == 4 for step in counted), counted
    assert steps["batches_per_step"] == 4


def test_watch_prints_one_line_per_capture(healthy_job, stalled_job, tmp_path, capsys):
    common = ["--interval", "1s", "--watch", "--count", "2", "--log_path", str(tmp_path)]
    assert main(["capture", stalled_job.address, "--duration", "1s", *common]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all("highly input-bound" in line and "bottleneck Map" in line for line in lines)

    assert main(["capture", healthy_job.address, "--duration", HEALTHY_CAPTURE, *common, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2
    assert all(row["verdict"] == "not" and row["steps"] > 10 and row["error"] is None for row in rows)
    assert all(0 <= row["input_share"] < 0.05 and row["step_ms"] > 0 for row in rows)
    assert len({row["capture"] for row in rows}) == 2
    assert len(list((tmp_path / "plugins" / "profile").iterdir())) == 4   # both watches' captures kept


def test_ctrl_c_stops_a_watch_cleanly(healthy_job, tmp_path):
    watching = subprocess.Popen(
        [sys.executable, "-m", "stallscope", "capture", healthy_job.address, "--watch", "--duration", "2s",
         "--interval", "1s", "--log_path", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's Ctrl-C finds it
    )
    try:
        first = watching.stdout.readline()     # the second capture is under way now
        watching.send_signal(signal.SIGINT)
        rest, err = watching.communicate(timeout=60)
    finally:
        if watching.poll() is None:
            watching.kill()
            watching.wait()
    assert "not input-bound" in first and rest == ""
    assert watching.returncode == 0 and err.splitlines()[-1] == "stopped after 1 capture(s)"
    assert [p.name for p in tmp_path.iterdir()] == ["plugins"]     # the interrupted capture left nothing
    assert len(list((tmp_path / "plugins" / "profile").iterdir())) == 1


def test_a_job_without_steps_then_one_that_ends_during_the_capture(tmp_path, capsys):
    # a job of its own, started here: one started with the module and left idle until this test did not
    # answer a capture at all once, in a full run (50 s, where the job should have ended in the window)
    job = LiveJob(tmp_path / "job", "--start-file", str(tmp_path / "job" / "start"),
                  "--idle-file", str(tmp_path / "job" / "idle"), "--die-during-capture")
    try:
        job.wait_until_idle()
        log_path = tmp_path / "captures"
        assert main(["capture", job.address, "--duration", "1s", "--log_path", str(log_path)]) == 2
        line = one_error_line(capsys.readouterr())
        assert job.address in line and "recorded nothing in the 1s window" in line
        assert not log_path.exists()          # made by the capture, removed with nothing in it
        assert main(["capture", job.address, "--duration", "1s", "--watch", "--count", "1", "--json",
                     "--log_path", str(log_path)]) == 0   # a watch reports such a window and goes on
        row = json.loads(capsys.readouterr().out)
        assert row["steps"] == 0 and row["verdict"] is None and "recorded nothing" in row["error"]

        job.start_file.touch()
        job.wait_until_stepping()
        assert main(["capture", job.address, "--duration", "20s", "--log_path", str(log_path)]) == 2
        line = one_error_line(capsys.readouterr())
        assert "stopped answering during the capture" in line
        assert job.process.wait(timeout=30) == 3   # it did end, as the line says
        assert not log_path.exists()
    finally:
        job.end()


def test_a_port_nobody_listens_on_is_one_line(tmp_path, capsys):
    port = free_port()
    assert main(["capture", f"localhost:{port}", "--log_path", str(tmp_path / "captures")]) == 2
    line = one_error_line(capsys.readouterr())
    assert f"localhost:{port}: nothing listens there (connection refused)" in line
    assert f"tf.profiler.experimental.server.start({port})" in line
    assert not (tmp_path / "captures").exists()


@pytest.mark.parametrize("address", ["localhost", "localhost:http", "localhost:70000", ":6009"])
def test_a_bad_address_names_it(address, tmp_path):
    with pytest.raises(UsageError, match="HOST:PORT: expected HOST:PORT"):
        CaptureOptions(address=address, log_path=tmp_path)


def test_flags_are_checked_before_any_capture(tmp_path, capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["capture", "localhost:1", "--duration", "soon"])
    assert "--duration: expected a duration such as 30s, 500ms or 2m, got 'soon'" in capsys.readouterr().err
    assert main(["capture", "localhost:1", "--count", "2", "--log_path", str(tmp_path / "c")]) == 2
    assert "--count: only with --watch" in capsys.readouterr().err
    assert main(["capture", "localhost:1", "--watch", "--markdown", "--log_path", str(tmp_path / "c")]) == 2
    assert "--markdown and --html need a single capture" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    for log_path, why in ((tmp_path / "file", "a file is there"), (tmp_path / "file" / "c", f"'{tmp_path}/file' is a file")):
        with pytest.raises(SystemExit, match="2"):
            main(["capture", "localhost:1", "--log_path", str(log_path)])
        line = one_error_line(capsys.readouterr())
        assert line.endswith(f"--log_path: expected a folder to write into, got '{log_path}' ({why})")
    assert (tmp_path / "file").read_text() == "x"
