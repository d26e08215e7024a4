"""The console script's shared behaviour: help, one-line errors, seed flag spellings."""

import argparse

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
def test_duration_seconds(text, expected):
    assert flags.duration_seconds(text) == expected


@pytest.mark.parametrize("bad", ["", "soon", "0s", "-5s", "5 fortnights"])
def test_duration_seconds_rejects(bad):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a time"):
        flags.duration_seconds(bad)


def test_int_or_autotune():
    assert flags.int_or_autotune("autotune") == -1
    assert flags.int_or_autotune("4") == 4
    with pytest.raises(argparse.ArgumentTypeError):
        flags.int_or_autotune("0")
