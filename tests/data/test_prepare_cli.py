"""`stallscope prepare`: the kinds through the console entry point, summaries and one-line errors."""

from __future__ import annotations

import io
import json
import re
import tarfile

import pytest

from stallscope.cli.main import main

TINY_FLAGS = ["--classes", "2", "--images_per_class=3", "--long-side", "32-48", "--quality", "80", "--workers", "1"]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_prepare_help_lists_every_kind(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["prepare", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "imagenet-val" in out and "synthetic" in out and "stallscope prepare synthetic --output" in out
    assert "imagenet-train" in out and "stallscope prepare imagenet-train ILSVRC2012_img_train.tar" in out


def test_prepare_without_a_kind_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["prepare"])
    assert exc.value.code == 2 and "KIND" in _one_line_error(capsys)


def test_synthetic_summary_then_nothing_to_do(tmp_path, capsys):
    out_dir = tmp_path / "data"
    assert main(["prepare", "synthetic", "--output", str(out_dir), *TINY_FLAGS]) == 0
    first = capsys.readouterr().out
    assert "images        6 (train 4, validation 2)" in first and "6 images made" in first
    low, high = map(int, re.search(r"long side (\d+)-(\d+) px", first).groups())
    assert 32 <= low <= high <= 48
    index = json.loads((out_dir / "synthetic.json").read_text())
    assert index["options"]["quality"] == [80, 80] and index["options"]["long_side"] == [32, 48]

    assert main(["prepare", "synthetic", f"--output={out_dir}", *TINY_FLAGS]) == 0
    assert "nothing to do" in capsys.readouterr().out

    assert main(["prepare", "synthetic", "--output", str(out_dir), *TINY_FLAGS, "--seed", "1"]) == 2
    err = _one_line_error(capsys)
    assert "--output" in err and "seed 0 there, 1 asked" in err and "--overwrite" in err


@pytest.mark.parametrize("flag, value, expected", [
    ("--quality", "95-75", "LOW-HIGH"),
    ("--long-side", "big", "LOW-HIGH"),
    ("--validation-fraction", "1.5", "[0, 1)"),
    ("--classes", "0", "positive integer"),
])
def test_synthetic_bad_flags_are_one_line(tmp_path, capsys, flag, value, expected):
    with pytest.raises(SystemExit) as exc:
        main(["prepare", "synthetic", "--output", str(tmp_path / "d"), flag, value])
    assert exc.value.code == 2
    err = _one_line_error(capsys)
    assert flag.lstrip("-").split("-")[0] in err and expected in err


def test_imagenet_val_from_a_tar(tmp_path, capsys, image_tree_factory):
    tree = image_tree_factory(classes=1, per_class=3, size=(32, 24))
    archive = tmp_path / "ILSVRC2012_img_val.tar"
    with tarfile.open(archive, "w") as tar:
        for number, jpeg in enumerate(sorted((tree / "class_00").iterdir()), start=1):
            tar.add(jpeg, arcname=f"ILSVRC2012_val_{number:08d}.JPEG")
        note = tarfile.TarInfo("notes.txt")
        note.size = 2
        tar.addfile(note, io.BytesIO(b"hi"))

    assert main(["prepare", "imagenet-val", str(archive), "--output", str(tmp_path / "images")]) == 0
    out = capsys.readouterr().out
    assert "3 images in 3 classes, 1-1 per class" in out and "3 placed, 0 already in place" in out
    assert "notes.txt: name does not match" in out and "prepare.json" in out
    assert (tmp_path / "images" / "n01751748" / "ILSVRC2012_val_00000001.JPEG").is_file()

    assert main(["prepare", "imagenet-val", str(archive), "-o", str(tmp_path / "images")]) == 0
    assert "0 placed, 3 already in place" in capsys.readouterr().out


def test_imagenet_val_errors_are_one_line(tmp_path, capsys):
    missing = tmp_path / "ILSVRC2012_img_val.tar"
    assert main(["prepare", "imagenet-val", str(missing), "--output", str(tmp_path / "o")]) == 2
    assert "does not exist" in _one_line_error(capsys)

    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"<html>not found</html>" * 50)
    assert main(["prepare", "imagenet-val", str(junk), "--output", str(tmp_path / "o")]) == 2
    assert "junk.tar: not a tar archive" in _one_line_error(capsys)

    folder = tmp_path / "extracted"
    folder.mkdir()
    assert main(["prepare", "imagenet-val", str(folder), "--output", str(tmp_path / "o"),
                 "--labels", str(tmp_path / "nope.txt")]) == 2
    err = _one_line_error(capsys)
    assert "--labels" in err and "nope.txt" in err

    with pytest.raises(SystemExit) as exc:
        main(["prepare", "imagenet-val", str(folder), "--output", str(tmp_path / "o"), "--link", "--copy"])
    assert exc.value.code == 2 and "not allowed with" in _one_line_error(capsys)


def test_damaged_archive_prints_the_summary_then_one_error_line(tmp_path, capsys, image_tree_factory):
    tree = image_tree_factory(classes=1, per_class=3, size=(32, 24))
    archive = tmp_path / "val.tar"
    with tarfile.open(archive, "w") as tar:
        for number, jpeg in enumerate(sorted((tree / "class_00").iterdir()), start=1):
            tar.add(jpeg, arcname=f"ILSVRC2012_val_{number:08d}.JPEG")
    with tarfile.open(archive) as tar:
        last = tar.getmembers()[-1]
    archive.write_bytes(archive.read_bytes()[: last.offset_data + 10])

    assert main(["prepare", "imagenet-val", str(archive), "--output", str(tmp_path / "images")]) == 2
    captured = capsys.readouterr()
    assert "2 images in 2 classes" in captured.out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "cut short in ILSVRC2012_val_00000003.JPEG" in err and "run again" in err


def test_imagenet_val_failures_are_one_line_and_leave_no_folder(tmp_path):
    import os
    import subprocess
    import sys

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "stallscope", "prepare", "imagenet-val", *map(str, argv)],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))

    empty = tmp_path / "empty"
    empty.mkdir()
    result = run(empty, "--output", tmp_path / "o")
    err = result.stderr.strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1 and "holds no ILSVRC2012 validation image" in err, err
    assert not (tmp_path / "o").exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = run(empty, "--output", blocker / "o")
    err = result.stderr.strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1 and "cannot write" in err and "a-file/o" in err, err


def test_synthetic_stops_promptly_on_ctrl_c_and_leaves_no_complete_looking_set(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while worker processes render:
    the run ends with one line and exit 130 long before the set is made, and no index claims a set."""
    import os
    import signal
    import subprocess
    import sys
    import time

    output = tmp_path / "data"
    total = 10 * 150  # minutes of rendering on two cores: an ignored Ctrl-C shows as a finished set or a timeout
    child = subprocess.Popen(
        [sys.executable, "-m", "stallscope", "prepare", "synthetic", "--output", str(output), "--classes", "10",
         "--images-per-class", "150", "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(output.glob("*/*/*.jpg")) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(child.pid, signal.SIGINT)
        at_interrupt = len(list(output.glob("*/*/*.jpg")))
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 130, err
    assert err.strip().splitlines()[-1] == "stallscope prepare: interrupted", err
    assert not (output / "synthetic.json").exists()
    made = len(list(output.glob("*/*/*.jpg")))
    # at most the batches already handed to the two workers (8 images each, and one queued) are finished
    assert made <= at_interrupt + 3 * 8 < total


def test_synthetic_into_a_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["prepare", "synthetic", "--output", str(blocker / "data"), *TINY_FLAGS]) == 2
    err = _one_line_error(capsys)
    assert "--output: cannot write" in err and "a-file/data" in err


def _class_archive(folder) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for number, jpeg in enumerate(sorted(folder.iterdir())):
            tar.add(jpeg, arcname=f"{folder.name}_{number}.JPEG")
    return buffer.getvalue()


def test_imagenet_train_from_the_tar_of_class_archives(tmp_path, capsys, image_tree_factory):
    tree = image_tree_factory(classes=2, per_class=3, size=(32, 24))
    for index, folder in enumerate(sorted(tree.iterdir())):
        folder.rename(tree / f"n0000000{index}")
    archive = tmp_path / "ILSVRC2012_img_train.tar"
    with tarfile.open(archive, "w") as tar:
        for folder in sorted(tree.iterdir()):
            data = _class_archive(folder)
            info = tarfile.TarInfo(f"{folder.name}.tar")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        bad = tarfile.TarInfo("n09999999.tar")
        bad.size = 600
        tar.addfile(bad, io.BytesIO(b"x" * 600))

    assert main(["prepare", "imagenet-train", str(archive), "--output", str(tmp_path / "train")]) == 2
    captured = capsys.readouterr()
    assert "6 images in 2 classes, 3-3 per class (ILSVRC2012 train has 1,281,167 in 1,000)" in captured.out
    assert "6 placed, 0 already in place" in captured.out and "n09999999.tar: damaged" in captured.out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "1 class archive(s) damaged, e.g. n09999999.tar" in err
    assert (tmp_path / "train" / "n00000001" / "n00000001_2.JPEG").is_file()

    assert main(["prepare", "imagenet-train", str(archive), "-o", str(tmp_path / "train")]) == 2
    assert "0 placed, 6 already in place" in capsys.readouterr().out


def test_imagenet_train_errors_are_one_line(tmp_path, capsys):
    missing = tmp_path / "ILSVRC2012_img_train.tar"
    assert main(["prepare", "imagenet-train", str(missing), "--output", str(tmp_path / "o")]) == 2
    assert "does not exist" in _one_line_error(capsys)
    (tmp_path / "unpacked" / "n01440764").mkdir(parents=True)
    assert main(["prepare", "imagenet-train", str(tmp_path / "unpacked"), "--output", str(tmp_path / "o")]) == 2
    assert "look unpacked already" in _one_line_error(capsys)
