"""convert stopped every way a user or a scheduler stops it, and into a full disk: its workers end
with it, the rerun is not refused and gives the same shards, the user's images are untouched."""

from __future__ import annotations

import signal

import pytest

from stallscope.records.convert import ConvertOptions, convert_tree

from .harness import snapshot

WORKERS = 3
START_S = 120  # until every worker writes a shard, on a loaded machine
STOPPED_WITHIN_S = 10.0


def _same_shards(src, out, shards: int, reference) -> None:
    convert_tree(ConvertOptions(src, reference, shards=shards, workers=1))
    names = sorted(p.name for p in reference.glob("*.tfrecord"))
    assert len(names) == shards and sorted(p.name for p in out.glob("*.tfrecord")) == names
    for name in names:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert sorted(p.name for p in out.iterdir()) == sorted(names + ["labels.txt", "manifest.json"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum, group", [(signal.SIGKILL, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["SIGKILL", "SIGTERM", "Ctrl-C"])
def test_convert_stopped_mid_run_leaves_no_worker_and_the_rerun_gives_the_same_shards(faults, noisy_tree_factory,
                                                                                       tmp_path, signum, group):
    """`kill -9 PID` and `kill PID` reach the parent alone; Ctrl-C reaches the whole process group."""
    src = noisy_tree_factory()
    before = snapshot(src)
    out = tmp_path / "out"
    argv = ["convert", src, "--output_path", out, "--no-progress", "--shards", "16", "--workers", WORKERS]
    name = f"convert {signal.Signals(signum).name}" + (" (group)" if group else "")
    run = faults.launch(name, argv, new_session=True)  # its own process group, as a terminal gives it
    run.wait_for(lambda: len(run.children()) >= WORKERS and len(list(out.glob(".*.tmp-*"))) >= WORKERS, START_S,
                 "worker writing a shard")
    run.send(signum, group=group)
    outcome = run.finish(60)
    if signum == signal.SIGKILL:
        outcome.check(rc=-signal.SIGKILL, within_s=STOPPED_WITHIN_S, stderr_lines=0)
    else:
        outcome.check(rc=130, within_s=STOPPED_WITHIN_S)
        assert outcome.stderr_lines == ["stallscope convert: interrupted"]
        assert not list(out.glob(".*.tmp-*")), "the workers' unfinished files are removed"
    assert not (out / "manifest.json").exists(), "a stopped run is never taken for complete"

    rerun = faults.run(f"{name}: rerun", argv, 300)
    rerun.check(rc=0, within_s=300, stderr_lines=0)
    _same_shards(src, out, 16, tmp_path / "reference")
    assert snapshot(src) == before


@pytest.mark.timeout(300)
def test_convert_into_a_full_disk_is_one_line_naming_the_flag_and_folder(faults, noisy_tree_factory, small_disk):
    src = noisy_tree_factory(per_class=12)  # about 3.8 MB of shards for 2 MB
    before = snapshot(src)
    out = small_disk / "out"
    outcome = faults.run("convert into a full disk", ["convert", src, "--output_path", out, "--shards", "4",
                                                      "--workers", "2", "--no-progress"], 300)
    outcome.check(rc=2, within_s=300)
    assert f"--output_path: {str(out)!r} is full (No space left on device" in outcome.stderr
    assert not [p.name for p in out.rglob("*") if ".tmp-" in p.name], "unfinished files hold the space a rerun needs"
    assert not (out / "manifest.json").exists()
    assert snapshot(src) == before


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["in_memory", "multi_processing"])
def test_beam_convert_stopped_by_sigterm_ends_in_one_line_and_leaves_no_worker(faults, noisy_tree_factory, tmp_path,
                                                                              mode):
    """Beam's FnApiRunner runs shards in this process (in_memory) or in SDK worker processes
    (multi_processing): SIGTERM ends either as Ctrl-C does, the workers stopped by PID, and a rerun
    finishes the same shards. Before, SIGTERM killed the launcher outright (exit -15, no line) and its
    workers each printed a gRPC traceback."""
    src = noisy_tree_factory(per_class=100, seed=5)
    before = snapshot(src)
    out = tmp_path / "out"
    argv = ["convert", src, "--output_path", out, "--shards", "16", "--runner", "beam", "--no-progress",
            "--beam-option", "--direct_num_workers=" + ("2" if mode == "multi_processing" else "1"),
            "--beam-option", f"--direct_running_mode={mode}"]
    run = faults.launch(f"convert --runner beam ({mode}) SIGTERM", argv)
    run.wait_for(lambda: list(out.glob("*.tfrecord")), START_S, "shard written")
    if mode == "multi_processing":
        assert run.children(), "Beam started no worker process"
    run.send(signal.SIGTERM)
    outcome = run.finish(60)
    # Beam's SDK worker processes log to a file of their own, not on convert's stderr (about 45 lines a run)
    outcome.check(rc=130, within_s=STOPPED_WITHIN_S, stderr_lines=1)
    assert outcome.stderr_lines[-1] == "stallscope convert: interrupted"
    assert not (out / "manifest.json").exists()

    rerun = faults.run(f"convert --runner beam ({mode}): rerun", argv, 300)
    assert rerun.rc == 0 and not rerun.traceback and rerun.orphans == [], rerun.stderr[-3000:]
    assert rerun.stderr.strip() == "", rerun.stderr[-3000:]
    _same_shards(src, out, 16, tmp_path / "reference")
    assert snapshot(src) == before
