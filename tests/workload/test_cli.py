"""`stallscope train` and `stallscope evaluate` from the command line: output, flags, one-line errors."""

import json
import os
import re
import shlex

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


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin the run to one")
def test_a_run_pinned_to_one_cpu_says_so(tiny_tree, tmp_path, capsys):
    """Under taskset (or a container's cpuset) the run's CPU figures are of the CPUs it may use."""
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})
    try:
        code = main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:40ms", "--steps", "6",
                     "--log_path", str(tmp_path / "run"), "--pipeline", "seed", *TINY])  # long enough to sample
    finally:
        os.sched_setaffinity(0, saved)
    out = capsys.readouterr().out
    assert code == 0
    cpu = json.loads((tmp_path / "run" / "summary.json").read_text())["cpu"]
    assert cpu["cores"] == 1 and cpu["cpus"] == 1 and cpu["quota_cores"] is None
    assert re.search(r"^CPU +\d\.\d\d of 1 core busy \(this process \d+\.\d\d\)$", out, re.MULTILINE), out


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to limit the run to fewer")
def test_tuned_under_a_cpu_quota_runs_a_pool_of_the_quotas_cores(tiny_tree, tmp_path, capsys, cpu_cgroup):
    """In a container limited to 1 CPU on a machine of more, tuned decodes on a private pool of one
    thread, not on TF's pool of one thread per CPU. The test process moves into a fresh cgroup for the
    run and back out before it is removed."""
    cpu_cgroup.limit(1.0)
    cpu_cgroup.procs.write_text(str(os.getpid()))
    try:
        code = main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--steps", "4",
                     "--log_path", str(tmp_path / "run"), "--pipeline", "tuned", *TINY])
    finally:
        cpu_cgroup.home.write_text(str(os.getpid()))
    assert code == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cpu"]["quota_cores"] == 1.0
    assert summary["pipeline"]["requested"]["private_threadpool_size"] == 1, summary["pipeline"]


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


def _store_gone(after_steps: int):
    """A _StepLoop method that fails as a store that stops answering does, once `after_steps` steps are taken."""
    from stallscope.errors import DataError

    def fail(loop, *args) -> bool:
        if len(loop.steps) >= after_steps:
            raise DataError("s3://bucket/tree/a.jpg: the store did not answer")
        return False
    return fail


def test_a_run_that_fails_before_its_first_step_leaves_no_run_folder(tiny_tree, tmp_path, capsys, monkeypatch):
    """The folder would hold only an empty events file, and look like a run: the CLI names none, and none is left
    (nor the runs/ folder made for it)."""
    from stallscope.workload.train import _StepLoop

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_StepLoop, "_run_iterators", _store_gone(after_steps=0))
    code = main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--steps", "3", *TINY])
    captured = capsys.readouterr()
    assert code == 2 and "did not answer" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert "run directory" not in captured.out
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_removes_nothing_it_did_not_write(tiny_tree, tmp_path, capsys, monkeypatch):
    """A --log_path that was there before keeps what it held; a run that took steps keeps its figures (with
    no summary.json, so it is not taken for a finished run)."""
    from stallscope.workload.train import _StepLoop

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    monkeypatch.setattr(_StepLoop, "_run_iterators", _store_gone(after_steps=0))
    assert main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--steps", "3",
                 "--log_path", str(mine), *TINY]) == 2
    assert (mine / "notes.txt").read_text() == "kept"
    monkeypatch.undo()
    monkeypatch.setattr(_StepLoop, "_precision_met", _store_gone(after_steps=1))  # asked after each step
    partial = tmp_path / "partial"
    assert main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--steps", "3",
                 "--log_path", str(partial), *TINY]) == 2
    assert list((partial / "train").glob("events.out.tfevents.*")) and not (partial / "summary.json").exists()
    capsys.readouterr()


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


def _one_line_error(capsys) -> tuple[str, str]:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err, captured.out


# Output places that cannot be written: a path under a regular FILE (tests run as root, so a
# chmod'ed folder would still be writable).
@pytest.mark.parametrize("argv, message", [
    (["train", "--dataset_path", "{tree}", "--log_path", "{file}/run"],
     "--log_path: expected a folder to write into, got '{file}/run' ('{file}' is a file)"),
    (["train", "--dataset_path", "{tree}", "--log_path", "{tmp}/run", "--checkpoint_path", "{file}/ckpt"],
     "--checkpoint_path: expected a folder to write into, got '{file}/ckpt' ('{file}' is a file)"),
    (["evaluate", "--checkpoint_path", "{tree}", "--dataset_path", "{tree}", "--log-path", "{file}/eval"],
     "--log-path: expected a folder to write into, got '{file}/eval' ('{file}' is a file)"),
    (["diagnose", "--dataset_path", "{tree}", "--fix", "--fixed_config", "{file}/fixed.json"],
     "--fixed_config: expected a file to write, got '{file}/fixed.json' ('{file}' is a file)"),
    (["diagnose", "--dataset_path", "{tree}", "--fix", "--fixed_config", "{tmp}"],
     "--fixed_config: expected a file to write, got '{tmp}' (a folder is there)"),
    (["diagnose", "--dataset_path", "{tree}", "--work_dir", "{file}"],
     "--work_dir: expected a folder to write into, got '{file}' (a file is there)"),
    (["train", "--dataset_path", "{tree}", "--log_path", "{tmp}/run", "--cache", "file",
      "--cache-path", "{tmp}/nonexistent/dir/c"],
     "--cache-path: expected a file name in an existing folder, got '{tmp}/nonexistent/dir/c' "
     "('{tmp}/nonexistent/dir' does not exist)"),
])
def test_unwritable_outputs_are_one_line_before_any_work(tiny_tree, tmp_path, capsys, argv, message):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder\n")
    fill = {"tree": tiny_tree, "tmp": tmp_path, "file": a_file}
    argv = [a.format(**fill) for a in argv] + ["--accelerator", "emulated:1ms", "--steps", "2", *TINY][
        : 0 if argv[0] == "evaluate" else None]
    if argv[0] == "diagnose":
        argv.remove("--steps")
        argv.remove("2")
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err, out = _one_line_error(capsys)
    assert code == 2 and err == f"stallscope {argv[0]}: error: {message.format(**fill)}"
    assert "run directory" not in out
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.parametrize("kept", ["manifest.json", "notes.txt"])
def test_fix_never_overwrites_a_file_that_is_not_a_pipeline_config(tiny_tree, tmp_path, capsys, kept):
    """--fixed-config pointed at a records folder's manifest or the user's notes: refused before any probe,
    the file kept as it was."""
    target = tmp_path / kept
    target.write_text('{"format": "stallscope-records", "splits": {}}\n' if kept.endswith(".json") else "my notes\n")
    before = target.read_text()
    code = main(["diagnose", "--dataset_path", str(tiny_tree), "--fix", "--fixed_config", str(target),
                 "--accelerator", "emulated:1ms", *TINY])
    err, _ = _one_line_error(capsys)
    assert code == 2 and "--fixed_config: expected a new file or a pipeline config an earlier --fix saved" in err
    assert target.read_text() == before

def test_fine_tuning_one_class_is_refused_and_an_emulated_run_on_it_goes_on(tiny_tree, tmp_path, capsys):
    """A softmax over one class learns nothing (loss 0, top-1 1.0 from the first step): a real model is
    refused in one line; an emulated accelerator, which trains no model, measures the input as before."""
    import shutil

    one = tmp_path / "one"
    shutil.copytree(sorted(p for p in tiny_tree.iterdir() if p.is_dir())[0], one / "only")
    code = main(["train", "--dataset_path", str(one), "--accelerator", "real", "--model", "mobilenet_v2",
                 "--weights", "none", "--steps", "2", "--log_path", str(tmp_path / "run"), *TINY])
    err, _ = _one_line_error(capsys)
    assert code == 2 and f"'{one}' has one class ('only'); expected at least 2 class folders" in err
    assert main(["train", "--dataset_path", str(one), "--accelerator", "emulated:1ms", "--steps", "2",
                 "--log_path", str(tmp_path / "emulated"), *TINY]) == 0

def test_a_run_that_fails_before_its_run_directory_names_none(tiny_tree, tmp_path, capsys):
    code = main(["train", "--dataset_path", str(tiny_tree), "--split", "validation", "--accelerator", "emulated:1ms",
                 "--log_path", str(tmp_path / "run"), *TINY])
    err, out = _one_line_error(capsys)
    assert code == 2 and "--split" in err
    assert "run directory" not in out and not (tmp_path / "run").exists()


def test_weights_imagenet_offline_is_one_line_and_fast(tiny_tree, tmp_path):
    """Offline is simulated by a proxy on a port nobody listens on, and an empty Keras cache."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{sock.getsockname()[1]}"
    (tmp_path / "keras").mkdir()
    env = dict(os.environ, KERAS_HOME=str(tmp_path / "keras"), HTTPS_PROXY=proxy, HTTP_PROXY=proxy,
               https_proxy=proxy, http_proxy=proxy, NO_PROXY="", no_proxy="")
    result = subprocess.run([sys.executable, "-m", "stallscope", "train", "--dataset_path", str(tiny_tree),
                             "--weights", "imagenet", "--alpha", "0.25", "--image_size", "128", "--batch_size", "4",
                             "--steps", "1", "--log_path", str(tmp_path / "run")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2, result.stderr
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("stallscope train: error: --weights: expected ImageNet weights Keras can download, "
                          "got no download of the mobilenet weights (URL fetch failure on https://")
    assert err.endswith("give a local weights file with --weights PATH or use --weights none")
    assert "run directory" not in result.stdout


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_every_knob_flag_explains_itself_with_its_default(capsys):
    import dataclasses

    from stallscope.pipeline.config import PipelineConfig, knob_docs

    text = _help(["train"], capsys)
    assert "see PipelineConfig" not in text
    for field in dataclasses.fields(PipelineConfig):
        if field.name != "preset":
            assert " ".join(knob_docs()[field.name].rstrip(".").split()) in text, field.name
    assert "batches prefetched at the end of the pipeline; off means no prefetch (default: autotune; seed: off)" in text
    assert "images per batch (default: 32)" in text
    assert "TF's rewrite that fuses consecutive maps: true, false, or TF's default (off) (default: default; " \
           "seed: false)" in text
    assert "--data-service-timeout DURATION" in text and "(default: 30s)" in text
    assert "images per batch (default: 32)" in _help(["diagnose"], capsys)


def test_the_docs_document_every_knob_as_help_does():
    import sys
    from pathlib import Path

    from stallscope.cli.train import knob_table

    repo = Path(__file__).parents[2]
    sys.path.insert(0, str(repo / "tools"))
    from docs_hooks import on_page_markdown  # the site's build hook writes the table from knob_table()

    page = on_page_markdown((repo / "docs" / "reference" / "pipeline-knobs.md").read_text(encoding="utf-8"))
    assert "\n".join(knob_table()) in page
    assert "| `--prefetch` | batches prefetched at the end of the pipeline; off means no prefetch. | " \
           "N\\|autotune\\|off | autotune | off | autotune |" in page


def test_serve_help_is_per_role_with_defaults(capsys):
    worker = _help(["serve", "worker"], capsys)
    assert "--dispatcher HOST:PORT" in worker and "(default: 30s)" in worker and "--workers" not in worker
    local = _help(["serve", "local"], capsys)
    assert "--workers N" in local and "(default: 1)" in local and "--dispatcher" not in local
    assert "(default: 0, a free one)" in _help(["serve", "dispatcher"], capsys)


def test_printed_commands_quote_paths(tiny_tree, tmp_path, capsys):
    run_dir = tmp_path / "my runs" / "it's here"
    assert main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--steps", "4",
                 "--profile_steps", "2:3", "--log_path", str(run_dir), *TINY]) == 0
    out = capsys.readouterr().out
    assert f"tensorboard --logdir {shlex.quote(str(run_dir))}  (Profile tab)" in out
    assert shlex.split(out.split("tensorboard ", 1)[1].split("  (Profile")[0]) == ["--logdir", str(run_dir)]


def test_evaluate_watch_waits_for_a_checkpoint_folder_that_does_not_exist_yet(split_tree, tmp_path, capsys,
                                                                              monkeypatch):
    import os
    import time

    import stallscope.workload.evaluate as evaluate_module

    staging = tmp_path / "staging"
    assert main(["train", "--dataset_path", str(split_tree), "--alpha", "0.25", "--steps", "1",
                 "--checkpoint_path", str(staging), "--log_path", str(tmp_path / "run"), *TINY]) == 0
    capsys.readouterr()
    later = tmp_path / "later"

    def appear_while_waiting(seconds: float) -> None:
        """The watcher's first wait: the folder appears whole (a rename), as a training job made it."""
        if staging.exists():
            os.rename(staging, later)
        time.sleep(0.01)

    monkeypatch.setitem(evaluate_module.watch.__kwdefaults__, "sleep", appear_while_waiting)
    code = main(["evaluate", "--checkpoint_path", str(later), "--dataset_path", str(split_tree), "--watch",
                 "--interval_secs", "60", "--max_evaluations", "1", "--batch_size", "4", "--cpu"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0] == (f"waiting for {later} to appear (written by `stallscope train --checkpoint_path`), "
                                   f"looking every 60s; Ctrl-C stops")
    assert re.search(r"^step 1: top-1 ", out, re.MULTILINE), out


def test_a_file_cache_another_run_holds_is_one_line(tiny_tree, tmp_path, capsys):
    (tmp_path / "c_0.lockfile").write_text("")  # TF's lock: a run writing the cache, or one that was killed
    code = main(["train", "--dataset_path", str(tiny_tree), "--accelerator", "emulated:1ms", "--steps", "2",
                 "--log_path", str(tmp_path / "run"), "--cache", "file", "--cache_path", str(tmp_path / "c"), *TINY])
    err, _ = _one_line_error(capsys)
    assert code == 2 and err == (f"stallscope train: error: --cache_path: expected a cache no other run is writing, got "
                                 f"'{tmp_path}/c' ('{tmp_path}/c_0.lockfile' is there; remove it if no other run "
                                 f"uses this cache)")
