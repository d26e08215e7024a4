"""`stallscope train` and `stallscope evaluate` from the command line: output, flags, one-line errors."""

import json
import re

import pytest

from stallscope.cli.main import main
from stallscope.cli.train import pipeline_from_args, resolve_model_flags
from stallscope.errors import UsageError

TINY = ["--image_size", "32", "--batch_size", "4", "--shuffle-buffer", "8"]


def test_train_prints_step_lines_and_the_verdict(tiny_tree, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:5ms", "--steps", "10",
                 "--log_every", "5", "--log_path", str(run_dir), "--pipeline", "seed", *TINY])
    out = capsys.readouterr().out
    assert code == 0
    assert f"run directory: {run_dir}" in out
    assert len(re.findall(r"^step \d+ \(", out, re.MULTILINE)) == 2 and "examples/sec" in out and "input wait" in out
    assert "input share" in out and "input-bound" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["pipeline"]["preset"] == "seed" and summary["pipeline"]["requested"]["batch_size"] == 4
    assert summary["pipeline"]["overrides"]["image_size"] == 32
    assert "pixels " not in out  # seed scales to [-1, 1] in the pipeline


def test_tuned_says_where_pixels_are_scaled(tiny_tree, tmp_path, capsys):
    assert main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--steps", "3",
                 "--log_path", str(tmp_path / "run"), "--pipeline", "tuned", *TINY]) == 0
    assert "scaled by the model's first layer on the device" in capsys.readouterr().out


def test_train_without_log_path_names_a_new_run_dir(tiny_tree, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--steps", "3", *TINY]) == 0
    out = capsys.readouterr().out
    created = [p for p in (tmp_path / "runs").iterdir()]
    assert len(created) == 1 and created[0].name.endswith("-emulated-files")
    assert f"run directory: runs/{created[0].name}" in out
    assert (created[0] / "summary.json").exists()


def test_knob_flags_override_the_preset(tmp_path):
    from stallscope.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["train", "--pipeline", "seed", "--map-parallelism", "autotune", "--prefetch", "2",
                              "--map_parallelization", "default", "--deterministic", "false", "--cache", "memory"])
    config = pipeline_from_args(args)
    assert (config.preset, config.map_parallelism, config.prefetch) == ("seed", -1, 2)
    assert config.map_parallelization is None and config.deterministic is False and config.cache == "memory"
    assert config.shuffle_buffer == 10240  # untouched knobs keep the preset's value
    args = parser.parse_args(["train", "--pipeline", "tuned", "--prefetch", "off"])
    assert pipeline_from_args(args).prefetch is None
    saved = tmp_path / "fixed.json"
    config.replace(batch_size=8).save(saved)
    args = parser.parse_args(["train", "--pipeline-config", str(saved), "--image-size", "64"])
    loaded = pipeline_from_args(args)
    assert (loaded.batch_size, loaded.image_size, loaded.map_parallelism) == (8, 64, -1)


def test_base_model_accepts_the_seed_meanings():
    assert resolve_model_flags(None, "imagenet", None) == ("mobilenet", "imagenet")
    assert resolve_model_flags(None, "inception_v3", None) == ("inception_v3", "none")
    assert resolve_model_flags("resnet50", None, "none") == ("resnet50", "none")
    assert resolve_model_flags(None, None, None) == ("mobilenet", "none")
    with pytest.raises(UsageError, match="--base-model"):
        resolve_model_flags("resnet50", "imagenet", None)


@pytest.mark.parametrize("argv, needle", [
    (["train", "--dataset_path", "{tree}", "--accelerator", "tpu"], "--accelerator"),
    (["train", "--dataset_path", "{missing}"], "does not exist"),
    (["train", "--dataset_path", "{tree}", "--profile_steps", "ten"], "--profile_steps"),
    (["train", "--dataset_path", "{tree}", "--fine_tune", "half"], "--fine_tune"),
    (["train", "--dataset_path", "{tree}", "--map-parallelism", "many"], "--map-parallelism"),
    (["train", "--dataset_path", "{tree}", "--base_model", "alexnet"], "--base_model"),
    (["train", "--dataset_path", "{tree}", "--split", "validation"], "--split"),
    (["train", "--dataset_path", "{tree}", "--accelerator", "emulated:5ms", "--validation_path", "{tree}"],
     "--validation_path"),
    (["train", "--dataset_path", "{tree}", "--validation_path", "{missing}"], "--validation_path"),
    (["train", "--dataset_path", "{tree}", "--model", "inception_v3", "--image_size", "32"], "at least 75"),
    (["evaluate", "--checkpoint_path", "{tree}", "--dataset_path", "{tree}", "--split", "train"], "no checkpoint"),
    (["evaluate", "--checkpoint_path", "{missing}", "--dataset_path", "{tree}"], "does not exist"),
])
def test_errors_are_one_line_with_exit_2(tiny_tree, tmp_path, capsys, argv, needle):
    argv = [a.format(tree=tiny_tree, missing=tmp_path / "missing") for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and needle in err, err


def test_evaluate_prints_accuracy_of_the_latest_checkpoint(split_tree, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert main(["train", "--dataset_path", str(split_tree), "--alpha", "0.25", "--steps", "2",
                 "--checkpoint_path", str(ckpt), "--log_path", str(tmp_path / "run"), *TINY]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint_path", str(ckpt), "--dataset_path", str(split_tree), "--json",
                 "--cpu", "--batch_size", "4"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 2 and result["examples"] == 6
    assert 0 <= result["top1"] <= result["top5"] <= 1


@pytest.mark.parametrize("preset, exact", [("tuned", True), ("seed", False)])
def test_resumed_run_says_whether_its_data_continues_where_it_stopped(preset, exact, tiny_tree, tmp_path):
    argv = ["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--pipeline", preset,
            "--checkpoint_path", str(tmp_path / "ckpt"), "--log_path", str(tmp_path / "run"), *TINY]
    assert main([*argv, "--steps", "3"]) == 0
    assert main([*argv, "--epochs", "2"]) == 0  # 24 images in batches of 4: epoch 0 has 6 steps, 3 done
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["resumed_from_step"] == 3 and summary["first_step"] == 4 and summary["last_step"] == 12
    assert summary["resumed_data"] == {"epoch": 0, "skipped_examples": 12 if exact else 0, "exact": exact}
