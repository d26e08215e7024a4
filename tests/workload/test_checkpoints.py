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
