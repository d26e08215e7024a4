"""The checkpoint store: finds complete checkpoints by their files, refuses another model's directory."""

import pytest

from stallscope.errors import UsageError
from stallscope.workload.checkpoints import CheckpointStore, list_checkpoints
from stallscope.workload.models import ModelSpec


def test_a_checkpoint_whose_state_file_was_never_written_is_still_resumed(tmp_path):
    """A kill between writing ckpt-N and updating the `checkpoint` state file must not lose ckpt-N."""
    store = CheckpointStore(tmp_path)
    for step in (5, 10):
        store.step.assign(step)
        store.save()
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\nall_model_checkpoint_paths: "ckpt-5"\n')
    assert [step for step, _ in list_checkpoints(tmp_path)] == [5, 10]
    assert CheckpointStore(tmp_path).restore_latest() == 10
    (tmp_path / "checkpoint").unlink()
    assert CheckpointStore(tmp_path).restore_latest() == 10


def test_an_empty_directory_starts_fresh(tmp_path):
    assert CheckpointStore(tmp_path / "new").restore_latest() == 0


def test_another_models_checkpoints_are_refused(tmp_path):
    ModelSpec(model="mobilenet", alpha=0.25, image_size=32, num_classes=3).save(tmp_path)
    store = CheckpointStore(tmp_path, spec=ModelSpec(model="mobilenet", alpha=0.5, image_size=32, num_classes=3))
    with pytest.raises(UsageError, match="alpha: saved 0.25, now 0.5"):
        store.restore_latest()


def test_a_checkpoint_resumes_with_pixels_scaled_elsewhere(tmp_path):
    """seed scales pixels in the pipeline, tuned on the device: the weights are the same model's."""
    ModelSpec(model="mobilenet", alpha=0.25, image_size=32, num_classes=3, input_range="minus_one_one").save(tmp_path)
    store = CheckpointStore(tmp_path, spec=ModelSpec(model="mobilenet", alpha=0.25, image_size=32, num_classes=3,
                                                     input_range="none"))
    assert store.restore_latest() == 0
    store.save()
    assert ModelSpec.load(tmp_path).input_range == "none"  # evaluation then feeds what this run fed


# Checkpoint directories that do not fit the run, and damaged checkpoints: one line, exit 2, no dump.

TINY = ["--image_size", "32", "--batch_size", "4", "--shuffle-buffer", "8", "--alpha", "0.25"]


def _run(tree, directory, tmp_path, *extra):
    from stallscope.cli.main import main

    return main(["train", "--dataset_path", str(tree), "--checkpoint_path", str(directory),
                 "--log_path", str(tmp_path / "run"), "--steps", "2", *TINY, *extra])


@pytest.fixture(scope="module")
def checkpoint_dirs(tiny_tree, tmp_path_factory):
    """{"real": a mobilenet run's checkpoints (fine-tune head), "emulated": an emulated run's}; copy before changing."""
    root = tmp_path_factory.mktemp("checkpoint_dirs")
    assert _run(tiny_tree, root / "real", root) == 0
    assert _run(tiny_tree, root / "emulated", root, "--accelerator", "emulated:1ms") == 0
    return {"real": root / "real", "emulated": root / "emulated"}


def _one_line_error(capsys, argv) -> str:
    from stallscope.cli.main import main

    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and len(err) < 400, err[:3000]
    return err


def _copy(source, tmp_path):
    import shutil

    return shutil.copytree(source, tmp_path / source.name)


def _train_argv(tree, directory, tmp_path, *extra):
    return ["train", "--dataset_path", str(tree), "--checkpoint_path", str(directory), "--log_path",
            str(tmp_path / "run"), "--steps", "4", *TINY, *extra]


def test_a_real_run_on_an_emulated_runs_checkpoints_says_what_differs(checkpoint_dirs, tiny_tree, tmp_path, capsys):
    directory = _copy(checkpoint_dirs["emulated"], tmp_path)
    err = _one_line_error(capsys, _train_argv(tiny_tree, directory, tmp_path))
    assert f"--checkpoint_path: {directory} holds checkpoints of an emulated-accelerator run" in err
    assert "this run trains mobilenet (alpha 0.25, 32 px, 3 classes, fine-tune head) with --accelerator real" in err


def test_an_emulated_run_on_a_real_runs_checkpoints_is_refused(checkpoint_dirs, tiny_tree, tmp_path, capsys):
    """Resuming would write step-only checkpoints after the model's, and evaluate would then find no model."""
    directory = _copy(checkpoint_dirs["real"], tmp_path)
    err = _one_line_error(capsys, _train_argv(tiny_tree, directory, tmp_path, "--accelerator", "emulated:1ms"))
    assert "holds checkpoints of a real mobilenet (alpha 0.25, 32 px, 3 classes, fine-tune head)" in err
    assert [step for step, _ in list_checkpoints(directory)] == [2]


def test_another_fine_tuning_mode_says_which(checkpoint_dirs, tiny_tree, tmp_path, capsys):
    directory = _copy(checkpoint_dirs["real"], tmp_path)
    err = _one_line_error(capsys, _train_argv(tiny_tree, directory, tmp_path, "--fine_tune", "full"))
    assert "holds checkpoints of another model (fine_tune: saved 'head', now 'full'" in err


def test_evaluate_on_an_emulated_runs_checkpoints(checkpoint_dirs, tiny_tree, capsys):
    err = _one_line_error(capsys, ["evaluate", "--checkpoint_path", str(checkpoint_dirs["emulated"]),
                                   "--dataset_path", str(tiny_tree), "--split", "train"])
    assert "holds checkpoints of an emulated-accelerator run (a step count, no model weights): nothing" in err


@pytest.mark.parametrize("damaged", ["ckpt-2.data-00000-of-00001", "ckpt-2.index"])
def test_evaluate_on_a_truncated_checkpoint_names_the_file(checkpoint_dirs, tiny_tree, tmp_path, capsys, damaged):
    directory = _copy(checkpoint_dirs["real"], tmp_path)
    path = directory / damaged
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 3)
    err = _one_line_error(capsys, ["evaluate", "--checkpoint_path", str(directory), "--dataset_path", str(tiny_tree),
                                   "--split", "train"])
    assert err.startswith(f"stallscope evaluate: error: {path}: cannot be read (") and "damaged or incomplete" in err


def test_another_models_checkpoints_without_model_json_are_one_line_and_nothing_after(checkpoint_dirs, tiny_tree,
                                                                                       tmp_path, faults):
    """Without model.json the mismatch is found when restoring: the one line, and none of TF's
    'Value in checkpoint could not be found' warnings (105 of them) when the restore is freed."""
    directory = _copy(checkpoint_dirs["real"], tmp_path)
    (directory / "model.json").unlink()
    argv = [*_train_argv(tiny_tree, directory, tmp_path), "--alpha", "0.5"]  # saved with alpha 0.25
    outcome = faults.run("train on another model's checkpoints (no model.json)", argv, 180)
    outcome.check(rc=2, within_s=180)
    line = outcome.stderr_lines[0]
    assert line.startswith("stallscope train: error: ") and "does not match this run's model" in line
