"""The console script's shared behaviour: help, one-line errors, seed flag spellings."""

import argparse
import re

import pytest

from stallscope.cli import flags
from stallscope.cli.main import main


def test_top_level_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "stallscope" in out and "COMMAND" in out


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2


def test_unknown_command_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "frobnicate" in err


def test_add_flag_accepts_both_spellings_and_forms():
    parser = argparse.ArgumentParser()
    flags.add_flag(parser, "size_per_record", type=flags.byte_size, default=1)
    for argv in (["--size_per_record=50M"], ["--size-per-record", "50M"], ["--size_per_record", "52428800"]):
        assert parser.parse_args(argv).size_per_record in (50 * 1024**2, 52428800)


@pytest.mark.parametrize("text, expected", [("52428800", 52428800), ("50M", 50 * 1024**2), ("1kb", 1000), ("2GiB", 2 * 1024**3)])
def test_byte_size(text, expected):
    assert flags.byte_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "0", "-5", "5 parsecs"])
def test_byte_size_rejects(bad):
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        flags.byte_size(bad)


@pytest.mark.parametrize("text, expected", [("5s", 5.0), ("500ms", 0.5), ("2m", 120.0), ("1.5", 1.5), ("1h", 3600.0)])
def test_duration(text, expected):
    assert flags.duration(text) == expected


@pytest.mark.parametrize("bad", ["", "soon", "0s", "-5s", "5 fortnights"])
def test_duration_rejects(bad):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a duration"):
        flags.duration(bad)


def test_int_or_autotune():
    assert flags.int_or_autotune("autotune") == -1
    assert flags.int_or_autotune("4") == 4
    with pytest.raises(argparse.ArgumentTypeError):
        flags.int_or_autotune("0")


# (argv, the flag as typed, what the message must say). Every error reads
# `stallscope COMMAND: error: --flag: expected ..., got ...` on one line, exit code 2.
BAD_FLAGS = [
    (["train", "--dataset_path", "{tree}", "--batch_size", "0"], "--batch_size", "a positive integer, got 0"),
    (["train", "--dataset-path", "{tree}", "--batch-size", "0"], "--batch-size", "a positive integer, got 0"),
    (["train", "--dataset_path", "{tree}", "--image_size=x"], "--image_size", "got 'x'"),
    (["train", "--dataset_path", "{tree}", "--source", "jpeg"], "--source", "one of files, records, got 'jpeg'"),
    (["train", "--dataset_path", "{tree}", "--steps"], "--steps", "a value, got nothing"),
    (["train", "--dataset_path", "{tree}", "--fine_tune", "half"], "--fine_tune", "got 'half'"),
    (["train", "--dataset_path", "{tree}", "--alpha", "-1"], "--alpha", "a positive number, got '-1'"),
    (["train", "--dataset_path", "{tree}", "--prefetch", "lots"], "--prefetch", "'autotune' or 'off', got 'lots'"),
    (["train", "--dataset_path", "{tree}", "--deterministic", "maybe"], "--deterministic", "true or false, got 'maybe'"),
    (["diagnose", "--dataset_path", "{tree}", "--phases", "head,bogus"], "--phases", "got 'bogus' in 'head,bogus'"),
    (["prepare", "synthetic", "-o", "{tmp}/s", "--long-side", "600-400"], "--long-side",
     "LOW <= HIGH, got '600-400'"),
    (["prepare", "synthetic", "-o", "{tmp}/s", "--long_side", "big"], "--long_side", "range LOW-HIGH, got 'big'"),
    (["convert", "{tree}", "--size_per_record", "-5M"], "--size_per_record", "above 0 bytes, got '-5M'"),
    (["convert", "{tree}", "--size-per-record=-5M"], "--size-per-record", "above 0 bytes, got '-5M'"),
    (["convert", "{tree}", "--shards", "-2"], "--shards", "a positive integer, got '-2'"),
    (["convert", "{tree}", "--read-ahead", "-1"], "--read-ahead", "'auto' or an integer >= 0, got '-1'"),
    (["verify", "{tree}", "--max-problems", "-1"], "--max-problems", "an integer >= 0, got '-1'"),
    (["evaluate", "--dataset_path", "{tree}"], "--checkpoint-path", "this flag, got nothing"),
    (["evaluate", "--checkpoint_path", "{tmp}/none", "--dataset_path", "{tree}"], "--checkpoint_path",
     "a checkpoint folder, got"),
    (["serve", "dispatcher", "--port", "-1"], "--port", "an integer >= 0, got '-1'"),
    (["train", "--dataset_path", "{tree}", "--data-service", "localhost:1", "--data-service-timeout", "0"],
     "--data-service-timeout", "a duration above 0, got '0'"),
    (["serve", "worker", "--dispatcher", "localhost:1", "--dispatcher_timeout", "soon"], "--dispatcher_timeout",
     "a duration such as 30s, 500ms or 2m, got 'soon'"),
    (["diagnose", "--dataset_path", "{tree}", "--steps", "2"], "--steps",
     "a flag of `stallscope diagnose` (see --help), got an unknown flag"),
]


@pytest.mark.parametrize("argv, flag, expected", BAD_FLAGS, ids=[" ".join(c[0][:1] + [c[1]]) for c in BAD_FLAGS])
def test_every_flag_error_has_one_format(tiny_tree, tmp_path, capsys, argv, flag, expected):
    argv = [a.format(tree=tiny_tree, tmp=tmp_path) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.fullmatch(rf"stallscope {argv[0]}( \w+)?: error: {re.escape(flag)}: expected .+, got .+", err), err
    assert expected in err, err


def test_an_os_error_no_check_foresaw_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    """The net under every command: the surroundings failing where no check of stallscope's came first
    (a folder removed or made unwritable mid-run, a full disk) is one line, not a traceback."""
    import stallscope.cli.verify

    missing = tmp_path / "gone" / "manifest.json"

    def run(args):
        missing.read_text()  # the folder went away under the command

    monkeypatch.setattr(stallscope.cli.verify, "run", run)
    assert main(["verify", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"stallscope verify: error: '{missing}': No such file or directory "
                   "(the operating system refused; --debug shows where)")
    with pytest.raises(FileNotFoundError):
        main(["--debug", "verify", str(tmp_path)])
