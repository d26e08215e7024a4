"""Profiles that cannot be had: capture from a job that accepts connections and never answers, analyze
of a huge file named *.xplane.pb. Each is one line, within its promised time, read without holding it."""

from __future__ import annotations

import pytest


@pytest.mark.timeout(120)
@pytest.mark.parametrize("timeout", ["2s", "30s"])
def test_capture_from_a_job_that_never_answers_names_it_as_not_answering(faults, tmp_path, timeout, silent_port):
    """TF's client waited 20 s here and then said the job "recorded nothing in the window": the job
    never answered. Said at once after --timeout, or after 5 s of the default 30 s."""
    address = f"127.0.0.1:{silent_port}"
    outcome = faults.run(f"capture, silent port, --timeout {timeout}", [
        "capture", address, "--duration", "1s", "--timeout", timeout, "--log_path", tmp_path / "captures"], 60)
    outcome.check(rc=2, within_s=19)  # TF's client gave up after 20 s, saying something else
    wait = "2s" if timeout == "2s" else "5s"
    assert outcome.stderr_lines == [
        f"stallscope capture: error: {address}: the job accepts connections but does not answer (no reply to a "
        f"gRPC greeting within {wait}); is its profiler server stuck, or is another program on this port?"]
    assert outcome.stdout == "" and not (tmp_path / "captures").exists()


@pytest.mark.timeout(120)
def test_analyze_of_a_huge_file_named_like_a_profile_is_one_line_without_reading_it_whole(faults, tmp_path):
    """A 1 GB file named *.xplane.pb was read whole first (12 s, 1.65 GB of memory): its framing is
    checked first now. Sparse, so it costs no disk."""
    run_dir = tmp_path / "run" / "plugins" / "profile" / "2020_01_01_00_00_00"
    run_dir.mkdir(parents=True)
    big = run_dir / "host.xplane.pb"
    with open(big, "wb") as stream:
        stream.truncate(1024 ** 3)
    outcome = faults.run("analyze of a 1 GB *.xplane.pb", ["analyze", tmp_path / "run"], 60)
    outcome.check(rc=2, within_s=30)  # TF's start-up on a loaded machine; 12 s of reading it whole before
    assert f"{big}: not a readable XSpace profile (byte 0 is 0x00" in outcome.stderr_lines[0]
    assert big.stat().st_size == 1024 ** 3  # the user's file, untouched
