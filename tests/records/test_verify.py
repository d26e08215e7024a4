"""verify_records names the shard, record and byte offset of each kind of damage; the CLI exits 1."""

from __future__ import annotations

import json
import shutil

import pytest

from stallscope.cli.main import main
from stallscope.records.convert import ConvertOptions, convert_tree
from stallscope.records.schema import SEED
from stallscope.records.verify import read_frames, verify_records
from stallscope.records.writer import ShardWriter, encode_example_bytes

SHARD = "train-00001-of-00003.tfrecord"




@pytest.fixture
def records(tiny_tree, tmp_path):
    out = tmp_path / "records"
    convert_tree(ConvertOptions(tiny_tree, out, shards=3, workers=1))
    return out


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _kinds(report):
    return {(p.file, p.kind) for p in report.problems}


def test_clean_records_pass(records, capsys):
    report = verify_records(records)
    assert report.ok and report.records == 24 and report.images_decoded == 24 and report.schema == "standard"
    assert main(["verify", str(records)]) == 0
    assert "OK: 3 shard(s), 24 records, 24 images decoded" in capsys.readouterr().out


def test_flipped_byte_in_image_data_names_record_and_offset(records, capsys):
    path = records / SHARD
    frames = list(read_frames(path.read_bytes()))
    target = frames[3]
    _flip(path, target.offset + 12 + len(target.payload) // 2)
    report = verify_records(records)
    assert not report.ok
    damage = next(p for p in report.problems if p.kind == "data checksum")
    assert (damage.file, damage.record, damage.offset) == (SHARD, 3, target.offset)
    assert ("train-00001-of-00003.tfrecord", "sha256") in _kinds(report)
    assert main(["verify", str(records)]) == 1
    out = capsys.readouterr().out
    assert f"{SHARD}: record 3 at byte {target.offset}: record data checksum mismatch" in out
    assert "FAILED" in out.splitlines()[-1]


def test_flipped_byte_in_length_stops_the_shard_at_that_record(records):
    path = records / SHARD
    frames = list(read_frames(path.read_bytes()))
    _flip(path, frames[5].offset + 2)
    problem = next(p for p in verify_records(records).problems if p.kind == "length checksum")
    assert (problem.record, problem.offset) == (5, frames[5].offset)


def test_truncated_shard(records):
    path = records / SHARD
    data = path.read_bytes()
    frames = list(read_frames(data))
    cut = frames[-2].offset + 30
    path.write_bytes(data[:cut])
    report = verify_records(records)
    problem = next(p for p in report.problems if p.kind == "truncated")
    assert (problem.file, problem.record, problem.offset) == (SHARD, len(frames) - 2, frames[-2].offset)
    assert {"size", "sha256"} <= {p.kind for p in report.problems}


def test_missing_and_unknown_shards(records):
    (records / SHARD).rename(records / "stray-00000-of-00001.tfrecord")
    kinds = _kinds(verify_records(records))
    assert (SHARD, "missing shard") in kinds
    assert ("stray-00000-of-00001.tfrecord", "unknown shard") in kinds


def test_count_mismatch_with_manifest(records):
    manifest_path = records / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["splits"]["train"]["shards"][0]["records"] += 1
    manifest_path.write_text(json.dumps(manifest))
    assert ("train-00000-of-00003.tfrecord", "count") in _kinds(verify_records(records))


def test_undecodable_image_and_bad_label_with_sound_framing(tmp_path, jpeg_factory):
    out = tmp_path / "records"
    out.mkdir()
    with ShardWriter(out / "bad-00000-of-00001.tfrecord") as writer:
        writer.write(encode_example_bytes(SEED, image=jpeg_factory(), label=0, filename=b"good.jpg"))
        jpeg = jpeg_factory()
        writer.write(encode_example_bytes(SEED, image=jpeg[: len(jpeg) // 3], label=1, filename=b"cut.jpg"))
        writer.write(encode_example_bytes(SEED, image=jpeg_factory(), label=-3, filename=b"neg.jpg"))
        writer.write(b"\x0a\x03not an example")
        writer.commit()
    report = verify_records(out)  # no manifest: schema detected, counts only
    assert report.schema == "seed" and not report.has_manifest and report.records == 4
    by_record = {p.record: p.kind for p in report.problems}
    assert by_record == {1: "image", 2: "label", 3: "parse"}


def test_images_are_decoded_in_windows_and_keep_their_record_numbers(tmp_path, jpeg_factory, monkeypatch):
    monkeypatch.setattr("stallscope.records.verify.DECODE_WINDOW", 3)
    out = tmp_path / "records"
    out.mkdir()
    jpeg = jpeg_factory()
    with ShardWriter(out / "w-00000-of-00001.tfrecord") as writer:
        for index in range(10):
            image = jpeg[: len(jpeg) // 3] if index in (4, 9) else jpeg
            writer.write(encode_example_bytes(SEED, image=image, label=0, filename=f"{index}.jpg".encode()))
        writer.commit()
    report = verify_records(out)
    assert [(p.record, p.kind) for p in report.problems] == [(4, "image"), (9, "image")]
    assert report.shards[0].images_decoded == 8 and report.records == 10


def test_seed_style_directory_without_manifest(records, tmp_path):
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    for i, shard in enumerate(sorted(records.glob("*.tfrecord"))):
        shutil.copy(shard, seed_dir / f"out_{i}.tfrecord")
    report = verify_records(seed_dir)
    assert report.ok and report.records == 24 and "counts only" in report.summary_line()


def test_cli_verify_errors_are_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["verify", str(tmp_path / "nope")])
    assert exc.value.code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["verify", str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "nope" in err[0] and "no manifest.json and no *.tfrecord" in err[1]


@pytest.mark.parametrize("content, needle", [
    (b"[]\n", "a JSON list; expected an object"),
    (b"\xff\xfe", "not valid JSON"),
    (b'{"format": "stallscope-records", "schema": "standard", "labels": [], "splits": []}', "malformed manifest"),
])
def test_unreadable_manifest_is_one_line_exit_2(tmp_path, capsys, content, needle):
    (tmp_path / "manifest.json").write_bytes(content)
    assert main(["verify", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_cli_shows_an_undecodable_image_as_one_readable_line(tmp_path, jpeg_factory):
    import os
    import subprocess
    import sys

    out = tmp_path / "records"
    out.mkdir()
    with ShardWriter(out / "bad-00000-of-00001.tfrecord") as writer:
        jpeg = jpeg_factory()
        writer.write(encode_example_bytes(SEED, image=b"\xff\xd8\xff" + bytes(10), label=0, filename=b"cut.jpg"))
        writer.write(encode_example_bytes(SEED, image=jpeg[: len(jpeg) // 2] + bytes(200) + jpeg[-2:], label=0, filename=b"z.jpg"))
        writer.commit()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")  # TF's C++ logging as a user has it by default
    result = subprocess.run([sys.executable, "-m", "stallscope", "verify", str(out)], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 1
    problem = next(line for line in result.stdout.splitlines() if "record 0" in line)
    assert "cannot decode the image" in problem and "{{" not in problem and "[Op:" not in problem, problem
    assert "E0000" not in result.stderr and "W0000" not in result.stderr and "Corrupt JPEG" not in result.stderr, result.stderr
