"""A real (tiny) model: training, checkpoints, resume after SIGKILL, and evaluation."""

import math
import os
import signal
import subprocess
import sys
import time

import pytest

from stallscope.errors import UsageError
from stallscope.workload.checkpoints import CheckpointStore, list_checkpoints
from stallscope.workload.evaluate import EvaluateOptions, evaluate_latest, watch
from stallscope.workload.models import ModelSpec
from stallscope.workload.train import TrainOptions, run_training


@pytest.fixture(scope="module")
def trained(split_tree, make_pipeline, tmp_path_factory):
    base = tmp_path_factory.mktemp("trained")
    options = TrainOptions(source="files", dataset_path=split_tree, validation_path=split_tree,
                           pipeline=make_pipeline("tuned"), model="mobilenet", alpha=0.25, fine_tune="last:5",
                           steps=6, checkpoint_path=base / "ckpt", checkpoint_every=3, log_path=base / "run",
                           log_every=2, learning_rate=1e-3)
    return options, run_training(options)


def test_real_run_trains_and_validates(trained):
    options, result = trained
    summary = result.summary
    assert summary["model"]["model"] == "mobilenet" and summary["model"]["fine_tune"] == "last:5"
    assert 0 < summary["model"]["trainable_parameters"] < summary["model"]["parameters"]
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] > 0
    assert summary["compute_ms"] > 0 and summary["accelerator"]["kind"] == "real"
    assert all(s.phase == "last:5" for s in result.steps)
    validation = summary["validation"]
    assert validation["examples"] == 6
    assert 0 <= validation["top1"] <= validation["top5"] <= 1 and validation["k"] == 3


def test_checkpoints_every_n_and_at_the_end(trained):
    options, _ = trained
    assert [step for step, _ in list_checkpoints(options.checkpoint_path)] == [3, 6]
    spec = ModelSpec.load(options.checkpoint_path)
    assert (spec.model, spec.num_classes, spec.image_size, spec.alpha) == ("mobilenet", 3, 32, 0.25)
    assert spec.labels == ("class_00", "class_01", "class_02")


def test_evaluate_latest_checkpoint(trained, split_tree):
    options, _ = trained
    result = evaluate_latest(EvaluateOptions(checkpoint_path=options.checkpoint_path, dataset_path=split_tree,
                                             batch_size=4))
    assert result.step == 6 and result.examples == 6
    assert 0 <= result.top1 <= result.top5 <= 1 and result.k == 3
    assert math.isfinite(result.loss) and result.loss > 0


def test_watch_follows_a_resumed_run(trained, split_tree):
    """The evaluator sees step 6, waits; training resumes to step 8 (not from 0); the evaluator sees step 8."""
    options, _ = trained
    resumed = []

    def train_while_waiting(seconds):
        assert not resumed, "watch should stop after its second evaluation"
        resumed.append(run_training(options.__class__(**{**options.__dict__, "steps": 8, "validation_path": None})))

    results = []
    done = watch(EvaluateOptions(checkpoint_path=options.checkpoint_path, dataset_path=split_tree, batch_size=4,
                                 watch=True, interval_secs=0.01, max_evaluations=2),
                 results.append, sleep=train_while_waiting)
    assert done == 2 and [r.step for r in results] == [6, 8]
    summary = resumed[0].summary
    assert summary["resumed_from_step"] == 6 and summary["first_step"] == 7 and summary["last_step"] == 8
    store = CheckpointStore(options.checkpoint_path)  # the step alone restores from a full checkpoint
    store.checkpoint.restore(store.latest).expect_partial()
    assert int(store.step.numpy()) == 8


def test_resume_after_sigkill_continues_the_step_and_optimizer(split_tree, tmp_path):
    """A real subprocess is killed once a checkpoint exists; the same command then finishes the run."""
    ckpt, run_dir = tmp_path / "ckpt", tmp_path / "run"
    command = [sys.executable, "-m", "stallscope", "train", "--source", "files", "--dataset_path", str(split_tree),
               "--model", "mobilenet", "--alpha", "0.25", "--image_size", "32", "--batch_size", "4",
               "--shuffle-buffer", "8", "--steps", "120", "--checkpoint_path", str(ckpt), "--checkpoint_every", "5",
               "--log_path", str(run_dir), "--log_every", "50"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list_checkpoints(ckpt) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL, first.stderr.read().decode()[-2000:]
    killed_at = list_checkpoints(ckpt)[-1][0]
    assert 5 <= killed_at < 120

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    import json

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_step"] >= killed_at and summary["resumed_from_step"] % 5 == 0
    assert summary["first_step"] == summary["resumed_from_step"] + 1 and summary["last_step"] == 120
    assert summary["steps"] == 120 - summary["resumed_from_step"]

    from stallscope.workload.models import build_model
    from stallscope.workload.train import _RealDevice

    model, _ = build_model(ModelSpec.load(ckpt))
    device = _RealDevice(model, 1e-4)
    store = CheckpointStore(ckpt, model=model, optimizer=device.optimizer)
    assert store.restore_latest() == 120
    assert int(device.optimizer.iterations.numpy()) == 120  # Adam's state came back, not restarted at 0


def test_validation_path_without_a_validation_split_is_refused(image_tree_factory, make_pipeline, tmp_path):
    """A tree with train/test splits must not silently validate on its training images."""
    train_tree = image_tree_factory(classes=2, per_class=2)
    other = image_tree_factory(classes=2, per_class=2, splits=("train", "test"))
    options = TrainOptions(source="files", dataset_path=train_tree, validation_path=other, steps=1,
                           pipeline=make_pipeline("seed"), model="mobilenet", alpha=0.25, log_path=tmp_path / "run")
    with pytest.raises(UsageError, match=r"--validation-path: .* has no 'validation' split; it has train, test"):
        run_training(options)


def _losses(options, **changes) -> dict[int, float]:
    seen: dict[int, float] = {}
    run_training(options.__class__(**{**options.__dict__, **changes}),
                 on_step=lambda progress: seen.__setitem__(progress.record.step, progress.loss))
    return seen


def test_a_resumed_run_sees_the_batches_an_uninterrupted_one_would(split_tree, make_pipeline, tmp_path):
    """Same seed, same steps: the resumed run's losses match the uninterrupted run's step for step,
    because the tuned pipeline's order is settled before decoding and it skips what was trained on."""
    options = TrainOptions(source="files", dataset_path=split_tree, pipeline=make_pipeline("tuned"), model="mobilenet",
                           alpha=0.25, fine_tune="full", steps=8, log_path=tmp_path / "whole", learning_rate=1e-2)
    whole = _losses(options)
    first = _losses(options, steps=4, checkpoint_path=tmp_path / "ckpt", checkpoint_every=4, log_path=tmp_path / "first")
    assert all(first[s] == pytest.approx(whole[s], rel=1e-4) for s in first)
    resumed = _losses(options, checkpoint_path=tmp_path / "ckpt", log_path=tmp_path / "second")
    assert sorted(resumed) == [5, 6, 7, 8]
    assert all(resumed[s] == pytest.approx(whole[s], rel=1e-4) for s in resumed), (whole, resumed)
