"""convert into s3:// clears what a killed run left there under convert's temporary names, and
nothing else, as the local path does (the loopback S3 server of conftest.py)."""

from __future__ import annotations

from stallscope.cli.main import main
from stallscope.storage import location

from .conftest import BUCKET


def _keys(client, prefix):
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix):] for o in listed)


def test_a_resumed_convert_clears_a_dead_runs_temporary_objects_only(s3_env, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    client = s3_env["client"]
    prefix = "resumed/"
    dead = ".train-00001-of-00002.tfrecord.tmp-4242"  # a run killed while uploading this shard
    state = ".stallscope-convert/.run.json.tmp-4242"
    users = ".notes.txt.tmp-7"  # hidden and temporary-looking, but not a name convert writes
    for key in (dead, state, users):
        client.put_object(Bucket=BUCKET, Key=prefix + key, Body=b"x" * 1000)
    location.forget_listings()
    out = f"s3://{BUCKET}/{prefix.rstrip('/')}"
    code = main(["convert", str(s3_env["tree"]), "--output_path", out, "--shards", "2", "--workers", "1", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert _keys(client, prefix) == sorted([users, "labels.txt", "manifest.json", "train-00000-of-00002.tfrecord",
                                            "train-00001-of-00002.tfrecord"])
    assert client.get_object(Bucket=BUCKET, Key=prefix + users)["Body"].read() == b"x" * 1000


def test_ctrl_c_while_converting_a_bucket_tree_stops_the_workers_at_once(s3_env, tmp_path):
    """The parent writes the shards of a tree in a bucket from its workers' chunks; Ctrl-C (or SIGTERM,
    which convert turns into the same KeyboardInterrupt) there stops the workers by PID, not once the
    traceback goes, and leaves no unfinished file."""
    import psutil
    import pytest

    from stallscope.records.convert import ConvertOptions, convert_tree

    def interrupt(done, total):
        if done:
            raise KeyboardInterrupt

    before = {p.pid for p in psutil.Process().children()}
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt) as stopped:
        convert_tree(ConvertOptions(f"s3://{BUCKET}/tree", out, shards=2, workers=3), progress=interrupt)
    workers = [p for p in psutil.Process().children() if p.pid not in before
               and "resource_tracker" not in " ".join(p.cmdline())]  # spawn's helper, which lives with this process
    alive = [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"workers {[p.pid for p in alive]} still run while the interrupt is being handled"
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]
    del stopped


def test_a_full_staging_disk_is_one_line_naming_the_bucket_and_the_folder(s3_env, small_disk, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(small_disk))
    mine = small_disk / "users-own-file"  # takes all the room there is; kept
    with open(mine, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
        except OSError:
            pass
    out = f"s3://{BUCKET}/full"
    code = main(["convert", str(s3_env["tree"]), "--output_path", out, "--shards", "2", "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"--output_path: {out} is staged first in the local folder '{small_disk}/stallscope/convert-staging/" in err, err
    assert "is full (No space left on device)" in err and "give --staging-dir a folder with room" in err, err
    assert mine.exists()
    assert _keys(s3_env["client"], "full/") == [], "the lease goes with the refused run"
