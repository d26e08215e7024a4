"""A run folder holds a record of the files stallscope wrote there: `train` refuses a folder where it would
replace a file of the user's or write through a link it did not make, and reruns into its own folder."""

import json
import os

import pytest

from stallscope.cli.main import main
from stallscope.errors import UsageError
from stallscope.workload import rundir

TINY = ["--image_size", "32", "--batch_size", "4", "--shuffle-buffer", "8"]


def _train(tree, run_dir, *extra):
    return main(["train", "--dataset_path", str(tree), "--accelerator", "emulated:1ms", "--steps", "2",
                 "--log_path", str(run_dir), *TINY, *extra])


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "run directory" not in captured.out, captured.out
    return err


@pytest.mark.parametrize("name, text", [
    ("steps.csv", "epoch,loss\n1,0.5\n"),
    ("pipeline.json", '{"mine": true}\n'),
    ("summary.json", '{"accuracy": 0.9}\n'),
])
def test_a_file_of_the_users_is_refused_before_any_work_and_kept(tiny_tree, tmp_path, capsys, name, text):
    run_dir = tmp_path / "u4"
    run_dir.mkdir()
    (run_dir / name).write_text(text)
    assert _train(tiny_tree, run_dir) == 2
    err = _one_line_error(capsys)
    assert f"--log_path: {str(run_dir)!r} holds {name!r}, not written by stallscope" in err, err
    assert (run_dir / name).read_text() == text
    assert sorted(p.name for p in run_dir.iterdir()) == [name], "the refused run wrote nothing"


def test_a_symlinked_steps_csv_is_refused_and_its_target_untouched(tiny_tree, tmp_path, capsys):
    outside = tmp_path / "elsewhere.csv"
    outside.write_text("the user's own rows\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "steps.csv").symlink_to(outside)
    assert _train(tiny_tree, run_dir) == 2
    err = _one_line_error(capsys)
    assert "'steps.csv', a symlink stallscope did not make" in err, err
    assert outside.read_text() == "the user's own rows\n"
    assert (run_dir / "steps.csv").is_symlink()


def test_a_symlinked_events_folder_is_refused(tiny_tree, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train").symlink_to(elsewhere, target_is_directory=True)
    assert _train(tiny_tree, run_dir) == 2
    assert "'train', a symlink stallscope did not make" in _one_line_error(capsys)
    assert list(elsewhere.iterdir()) == []


def test_a_rerun_into_its_own_folder_replaces_its_own_files(tiny_tree, tmp_path, capsys):
    run_dir = tmp_path / "run"
    notes = run_dir / "notes.txt"
    assert _train(tiny_tree, run_dir) == 0
    notes.write_text("kept")  # a file the run never writes stays beside it
    record = json.loads((run_dir / rundir.OWNED_NAME).read_text())
    assert set(record["written"]) == set(rundir.RUN_FILES)
    first = (run_dir / "summary.json").stat().st_ino
    assert _train(tiny_tree, run_dir, "--steps", "3") == 0
    capsys.readouterr()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3
    assert (run_dir / "summary.json").stat().st_ino != first, "written whole under a new name, then renamed"
    assert notes.read_text() == "kept"
    assert not [p.name for p in run_dir.iterdir() if ".tmp-" in p.name]


def test_a_folder_written_before_the_record_is_still_ours(tiny_tree, tmp_path, capsys):
    """A run folder of an earlier stallscope has no record: files that start as ours do are ours."""
    run_dir = tmp_path / "run"
    assert _train(tiny_tree, run_dir) == 0
    (run_dir / rundir.OWNED_NAME).unlink()
    assert _train(tiny_tree, run_dir) == 0
    capsys.readouterr()
    assert set(json.loads((run_dir / rundir.OWNED_NAME).read_text())["written"]) == set(rundir.RUN_FILES)


def test_a_symlinked_record_is_refused(tmp_path):
    """A record stallscope did not make vouches for nothing, and is never written through."""
    target = tmp_path / "target.json"
    target.write_text('{"written": ["steps.csv"]}')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / rundir.OWNED_NAME).symlink_to(target)
    with pytest.raises(UsageError, match="a symlink stallscope did not make"):
        rundir.claim_run_dir(run_dir, flag="--log-path")
    with pytest.raises(UsageError):
        rundir.write_json(run_dir, rundir.SUMMARY_NAME, {"step_time_ms": 1})
    assert target.read_text() == '{"written": ["steps.csv"]}' and not (run_dir / rundir.SUMMARY_NAME).exists()


def test_a_file_of_the_users_that_appears_during_the_run_is_not_replaced(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rundir.claim_run_dir(run_dir, flag="--log-path")
    (run_dir / rundir.STEPS_NAME).write_text("epoch,loss\n")
    with pytest.raises(UsageError, match="'steps.csv', not written by stallscope"):
        rundir.write_steps(run_dir, [])
    assert (run_dir / rundir.STEPS_NAME).read_text() == "epoch,loss\n"
    assert not os.path.exists(run_dir / rundir.OWNED_NAME)
