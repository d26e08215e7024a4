"""Unpacking ILSVRC2012 training images: a tiny archive of class archives, the original's shape."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from stallscope.data.imagenet import REPORT_NAME
from stallscope.data.imagenet_train import prepare_imagenet_train
from stallscope.errors import DataError, UsageError

SYNSETS = ("n01440764", "n01443537", "n01484850")
MTIME = 1_340_000_000
PNG = b"\x89PNG\r\n\x1a\n" + bytes(40)  # ILSVRC2012 train has a PNG named .JPEG


@pytest.fixture
def class_files(image_tree_factory) -> dict[str, dict[str, bytes]]:
    """Three synsets of four small JPEGs each, under ImageNet train's names."""
    tree = image_tree_factory(classes=len(SYNSETS), per_class=4, size=(40, 30))
    return {
        synset: {f"{synset}_{1000 + i}.JPEG": path.read_bytes() for i, path in enumerate(sorted(folder.iterdir()))}
        for synset, folder in zip(SYNSETS, sorted(tree.iterdir()))
    }


def _tar_bytes(files: dict[str, bytes], gz: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), MTIME
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _class_archives(class_files) -> dict[str, bytes]:
    return {f"{synset}.tar": _tar_bytes(files) for synset, files in class_files.items()}


def _outer(path: Path, members: dict[str, bytes], gz: bool = False) -> Path:
    path.write_bytes(_tar_bytes(members, gz))
    return path


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), int(p.stat().st_mtime))
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != REPORT_NAME
    }


def _expected(class_files) -> dict[str, tuple[bytes, int]]:
    return {f"{s}/{name}": (data, MTIME) for s, files in class_files.items() for name, data in files.items()}


@pytest.mark.parametrize("gz", [False, True])
def test_the_train_tar_is_unpacked_into_synset_folders(tmp_path, class_files, gz):
    source = _outer(tmp_path / "ILSVRC2012_img_train.tar", _class_archives(class_files), gz)

    other = tmp_path / "train" / "notes"  # a folder of the user's under the output: not a class, left alone
    other.mkdir(parents=True)
    (other / "todo.txt").write_text("x")
    (other / ".keep.tmp-1").write_text("x")

    report = prepare_imagenet_train(source, tmp_path / "train")

    assert sorted(p.name for p in other.iterdir()) == [".keep.tmp-1", "todo.txt"]
    for path in other.iterdir():
        path.unlink()
    other.rmdir()
    assert _tree(tmp_path / "train") == _expected(class_files)  # the bytes, and each member's time
    assert report.placed == 12 and report.in_place == 0 and report.per_class == dict.fromkeys(SYNSETS, 4)
    assert report.complete and not report.unplaced and not report.damaged and not report.not_jpeg
    assert not report.is_whole_ilsvrc2012_train
    written = json.loads((tmp_path / "train" / REPORT_NAME).read_text())
    assert written["kind"] == "imagenet-train" and written["complete"] is True and written["images"] == 12


def test_a_folder_of_class_archives_gives_the_same_tree(tmp_path, class_files):
    folder = tmp_path / "tars"
    folder.mkdir()
    for name, data in _class_archives(class_files).items():
        (folder / name).write_bytes(data)
    (folder / "README.txt").write_text("not a class archive")

    report = prepare_imagenet_train(folder, folder / "train")  # an output inside the source is not a source entry
    again = prepare_imagenet_train(folder, folder / "train")

    assert _tree(folder / "train") == _expected(class_files)
    assert [(u.name, u.reason.split(" (")[0]) for u in report.unplaced] == [("README.txt", "not a class archive")]
    assert report.source_kind == "folder" and again.in_place == 12 and again.unplaced == report.unplaced


def test_running_twice_keeps_the_files_and_a_killed_run_is_finished(tmp_path, class_files):
    source = _outer(tmp_path / "train.tar", _class_archives(class_files))
    out = tmp_path / "train"
    prepare_imagenet_train(source, out)
    inodes = {p: p.stat().st_ino for p in out.rglob("*.JPEG")}

    again = prepare_imagenet_train(source, out)
    assert again.placed == 0 and again.in_place == 12
    assert {p: p.stat().st_ino for p in out.rglob("*.JPEG")} == inodes  # not rewritten

    # What a kill leaves: a temporary, a missing file, a file that is not the source's.
    folder = out / SYNSETS[1]
    (folder / f".{SYNSETS[1]}_1000.JPEG.tmp-4242").write_bytes(b"half")
    (folder / f"{SYNSETS[1]}_1001.JPEG").unlink()
    (folder / f"{SYNSETS[1]}_1002.JPEG").write_bytes(b"not the source's bytes")

    finished = prepare_imagenet_train(source, out)

    assert finished.placed == 2 and finished.in_place == 10
    assert _tree(out) == _expected(class_files)


def test_every_odd_entry_is_placed_or_reported_with_its_reason(tmp_path, class_files):
    odd = dict(class_files[SYNSETS[0]])
    odd[f"{SYNSETS[0]}_2933.JPEG"] = PNG
    odd[".hidden.JPEG"] = b"\xff\xd8\xff" + bytes(10)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in odd.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), MTIME
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("link.JPEG")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
        twice = tarfile.TarInfo(f"sub/{SYNSETS[0]}_1000.JPEG")  # the same name again, in a folder
        twice.size = 3
        archive.addfile(twice, io.BytesIO(b"abc"))
    members = {f"{SYNSETS[0]}.tar": buffer.getvalue(), "notes.txt": b"hello", "n09999999.tar": b"junk " * 300}
    source = _outer(tmp_path / "train.tar", members)

    report = prepare_imagenet_train(source, tmp_path / "train")

    reasons = {u.name: u.reason for u in report.unplaced}
    assert set(reasons) == {f"{SYNSETS[0]}.tar:.hidden.JPEG", f"{SYNSETS[0]}.tar:link.JPEG",
                            f"{SYNSETS[0]}.tar:sub/{SYNSETS[0]}_1000.JPEG", "notes.txt"}
    assert "second copy" in reasons[f"{SYNSETS[0]}.tar:sub/{SYNSETS[0]}_1000.JPEG"]
    assert "not a class archive" in reasons["notes.txt"]
    # The PNG is the user's data: placed, and named for convert to repair.
    assert (tmp_path / "train" / SYNSETS[0] / f"{SYNSETS[0]}_2933.JPEG").read_bytes() == PNG
    assert [(u.name, "a PNG" in u.reason) for u in report.not_jpeg] == [(f"{SYNSETS[0]}.tar:{SYNSETS[0]}_2933.JPEG", True)]
    # A class archive that is no archive is damaged; the run goes on and says so.
    assert [u.name for u in report.damaged] == ["n09999999.tar"] and not report.complete
    assert report.per_class == {SYNSETS[0]: 5}
    assert not (tmp_path / "train" / "n09999999").exists()


def test_a_damaged_class_archive_keeps_what_came_before_and_the_next_ones_are_unpacked(tmp_path, class_files):
    tars = _class_archives(class_files)
    whole = tars[f"{SYNSETS[1]}.tar"]
    with tarfile.open(fileobj=io.BytesIO(whole)) as archive:
        third = archive.getmembers()[2]
    tars[f"{SYNSETS[1]}.tar"] = whole[: third.offset_data + 100]  # cut inside its third image
    source = _outer(tmp_path / "train.tar", tars)

    report = prepare_imagenet_train(source, tmp_path / "train")

    assert report.per_class == {SYNSETS[0]: 4, SYNSETS[1]: 2, SYNSETS[2]: 4}
    assert [u.name for u in report.damaged] == [f"{SYNSETS[1]}.tar"]
    assert f"in {SYNSETS[1]}_1002.JPEG" in report.damaged[0].reason
    assert [u.name for u in report.unplaced] == [f"{SYNSETS[1]}.tar:{SYNSETS[1]}_1002.JPEG"]
    assert report.archive_error is None and not report.complete
    assert not any(p.name.startswith(".") for p in (tmp_path / "train").rglob("*"))  # no half file


def test_a_cut_train_tar_keeps_what_came_before_and_says_where_it_broke(tmp_path, class_files):
    archive = _outer(tmp_path / "train.tar", _class_archives(class_files))
    with tarfile.open(archive) as whole:
        second = whole.getmembers()[1]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(archive.read_bytes()[: second.offset_data + 2000])

    report = prepare_imagenet_train(cut, tmp_path / "train")

    assert report.per_class.get(SYNSETS[0]) == 4 and SYNSETS[2] not in report.per_class
    assert report.archive_error and f"in {SYNSETS[1]}.tar" in report.archive_error and "cut.tar" in report.archive_error
    assert not report.damaged, "the class archive broke off because the outer one did"
    assert json.loads((tmp_path / "train" / REPORT_NAME).read_text())["complete"] is False
    assert not any(p.name.startswith(".") for p in (tmp_path / "train").rglob("*"))


def test_bad_sources_are_clear_errors_and_leave_no_output(tmp_path, class_files):
    with pytest.raises(UsageError, match="does not exist"):
        prepare_imagenet_train(tmp_path / "missing.tar", tmp_path / "out")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not an archive " * 40)
    with pytest.raises(DataError, match="junk.tar: not a tar archive"):
        prepare_imagenet_train(junk, tmp_path / "new" / "out")
    flat = _outer(tmp_path / "val.tar", class_files[SYNSETS[0]])  # JPEGs, not class archives
    with pytest.raises(DataError, match="no training image could be placed.*not a class archive"):
        prepare_imagenet_train(flat, tmp_path / "new" / "out")
    unpacked = tmp_path / "unpacked"
    (unpacked / SYNSETS[0]).mkdir(parents=True)
    with pytest.raises(DataError, match="look unpacked already"):
        prepare_imagenet_train(unpacked, tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists(), "a failed run left the folders it made"
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(UsageError, match="--output"):
        prepare_imagenet_train(junk, afile)


def _bytes_read() -> int:
    with open("/proc/self/io") as io_file:
        return next(int(line.split()[1]) for line in io_file if line.startswith("rchar:"))


def test_a_second_run_passes_over_the_files_in_place_without_reading_them(tmp_path):
    big = {f"{s}_{i}.JPEG": b"\xff\xd8\xff" + bytes([i]) * 600_000 for s in SYNSETS[:2] for i in range(5)}
    members = {f"{s}.tar": _tar_bytes({k: v for k, v in big.items() if k.startswith(s)}) for s in SYNSETS[:2]}
    source = _outer(tmp_path / "train.tar", members)
    size = source.stat().st_size
    progress: list[int] = []

    before = _bytes_read()
    prepare_imagenet_train(source, tmp_path / "train")
    first = _bytes_read() - before
    before = _bytes_read()
    again = prepare_imagenet_train(source, tmp_path / "train", progress=lambda n, total, unit: progress.append(n))
    second = _bytes_read() - before

    assert first > size * 0.9 and again.in_place == 10
    assert second < size / 10, f"a rerun read {second} bytes of a {size}-byte archive"
    assert sum(progress) <= size and sum(progress) > size * 0.9  # the progress bar still reaches the end


def test_a_file_that_cannot_be_written_is_the_outputs_error_not_damage_in_the_archive(tmp_path, class_files):
    source = _outer(tmp_path / "train.tar", _class_archives(class_files))
    blocker = tmp_path / "train" / SYNSETS[1] / f"{SYNSETS[1]}_1001.JPEG"
    (blocker / "inside").mkdir(parents=True)  # a folder where an image goes: its rename fails, as on a full disk

    with pytest.raises(UsageError, match=rf"--output: cannot write .*{SYNSETS[1]}_1001.JPEG.*writable directory"):
        prepare_imagenet_train(source, tmp_path / "train")

    assert not any(p.name.startswith(".") for p in (tmp_path / "train").rglob("*"))  # its temporary is gone
    assert not (tmp_path / "train" / REPORT_NAME).exists()  # no report says the run went through
