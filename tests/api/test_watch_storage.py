"""`stallscope.watch_storage()` in the user's own program: TF's read of a file on a network file system
that the server does not answer ends the program with one line, instead of hanging it; a callback may
take the line instead."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.fuse_mount import why_no_fuse
from stallscope.storage.stuck_calls import StuckCallWatch

from ..storage.conftest import child_environment

pytestmark = [
    pytest.mark.skipif(bool(why_no_fuse()), reason=f"needs a FUSE mount: {why_no_fuse()}"),
    pytest.mark.skipif(not StuckCallWatch.available(), reason="needs Linux's /proc/self/task/*/syscall"),
]

PROGRAM = textwrap.dedent("""
    import sys
    import tensorflow as tf
    import stallscope

    if sys.argv[2] == "callback":
        told = []
        watch = stallscope.watch_storage(0.5, on_stuck=told.append)
        tf.io.read_file(sys.argv[1]).numpy()  # slow, but answered: the callback was told, nothing ended
        watch.stop()
        print("told:", told[0])
    else:
        stallscope.watch_storage(0.5)
        tf.io.read_file(sys.argv[1]).numpy()
        print("read it")
""")


def test_a_read_that_is_not_answered_ends_the_program_or_tells_its_callback(tmp_path):
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    (served / "image.jpg").write_bytes(bytes(3000))
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    # 1 KB/s: the file's one read takes 3 s
    with emulate(served, kind="mount", mount_point=mount, latency_s=0.0, bandwidth_bps=8_000, max_duration_s=120):
        ended = subprocess.run([sys.executable, str(program), str(mount / "image.jpg"), "end"],
                               capture_output=True, text=True, timeout=120, env=child_environment())
        told = subprocess.run([sys.executable, str(program), str(mount / "image.jpg"), "callback"],
                              capture_output=True, text=True, timeout=120, env=child_environment())
    line = (f"the file system ({{}}) reading {str(mount.resolve() / 'image.jpg')!r} did not answer for 0.5 s; "
            "expected it within watch_storage's timeout_s")
    assert ended.returncode == 2 and "read it" not in ended.stdout, ended.stderr[-2000:]
    last = ended.stderr.strip().splitlines()[-1]
    fstype = last.split("(")[1].split(")")[0]
    assert last == "stallscope: " + line.format(fstype)
    assert told.returncode == 0, told.stderr[-2000:]
    assert told.stdout.strip().splitlines()[-1] == "told: " + line.format(fstype)
