"""prepare into a folder on a network file system: the files land as on a local disk, and a server that
stops answering ends the run in one line naming --output instead of hanging it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stallscope.data.imagenet import prepare_imagenet_val
from stallscope.data.synthetic import _render_all, make_synthetic, plan
from stallscope.storage import location
from stallscope.storage.emulator import emulate
from stallscope.storage.emulator.fuse_mount import why_no_fuse
from stallscope.storage.location import StorageError
from stallscope.storage.mounts import NetworkGuard

from ..storage.conftest import child_environment
from .test_imagenet import _tree, _write_folder, val_images  # noqa: F401  (a fixture)
from .test_synthetic import TINY, _files

WHY_NO_FUSE = why_no_fuse()
pytestmark = pytest.mark.skipif(bool(WHY_NO_FUSE), reason=f"needs a FUSE mount (/dev/fuse, fuse3, mfusepy): {WHY_NO_FUSE}")
LIMIT_S = 120  # the mount's server stops itself after this


def test_prepare_places_the_same_files_on_a_slow_mount_and_gives_up_on_one_that_stops_answering(tmp_path, val_images):  # noqa: F811
    source = _write_folder(tmp_path / "extracted", val_images)
    local = prepare_imagenet_val(source, tmp_path / "local")
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    with emulate(served, kind="mount", mount_point=mount, latency_s=0.002, writable=True, max_duration_s=LIMIT_S):
        mounted = prepare_imagenet_val(source, mount / "images")
    assert mounted.images == local.images == 6
    assert _tree(served / "images") == _tree(tmp_path / "local")
    (served / "late").mkdir()  # made beside the mount: only the placing goes through it
    location.set_timeout(0.5)
    try:
        with emulate(served, kind="mount", mount_point=mount, latency_s=3.0, writable=True, max_duration_s=LIMIT_S):
            started = time.monotonic()
            with pytest.raises(StorageError, match=r"^--output: the file system \(fuse[.\w-]*\) placing files into "
                                                   r"'.+/mnt/late' did not answer for 0.5 s \(after 0 files\); "
                                                   r"expected it within --storage-timeout$"):
                prepare_imagenet_val(source, mount / "late")
            assert time.monotonic() - started < 2.5
    finally:
        location.set_timeout(location.DEFAULT_TIMEOUT_S)


def test_an_output_folder_that_stops_answering_is_one_line(tmp_path, val_images):  # noqa: F811
    source = _write_folder(tmp_path / "extracted", val_images)
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    with emulate(served, kind="mount", mount_point=mount, latency_s=3.0, writable=True, max_duration_s=LIMIT_S):
        done = subprocess.run([sys.executable, "-m", "stallscope", "prepare", "imagenet-val", str(source), "--output",
                               str(mount / "images"), "--storage-timeout", "0.5"],
                              capture_output=True, text=True, timeout=60, env=child_environment())
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0] == (f"stallscope prepare: error: --output: the file system ({lines[0].split('(')[1].split(')')[0]}) "
                        f"creating {str(mount / 'images')!r} did not answer for 0.5 s; expected it within --storage-timeout")


def test_synthetic_makes_the_same_bytes_on_a_slow_mount_and_gives_up_on_one_that_stops_answering(tmp_path):
    """Rendering workers write into the mount; the parent gives them up (and ends them) once none has put
    an image in place for the timeout. Starting the workers does not count against it: the same 0.5 s
    timeout passes on a mount at 2 ms a request."""
    local = make_synthetic(tmp_path / "local", TINY)
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    location.set_timeout(0.5)
    try:
        with emulate(served, kind="mount", mount_point=mount, latency_s=0.002, writable=True, max_duration_s=LIMIT_S):
            mounted = make_synthetic(mount / "images", TINY)
        assert mounted.images == local.images == 12 and mounted.written == 12
        assert _files(served / "images") == _files(tmp_path / "local")
        assert (served / "images" / "synthetic.json").read_bytes() == (tmp_path / "local" / "synthetic.json").read_bytes()
        with emulate(served, kind="mount", mount_point=mount, latency_s=3.0, writable=True, max_duration_s=LIMIT_S):
            late = mount / "late"
            started = time.monotonic()
            with pytest.raises(StorageError, match=r"^--output: the file system \(fuse[.\w-]*\) writing images into "
                                                   r"'.+/mnt/late' did not answer for 0.5 s \(after 0 images\); "
                                                   r"expected it within --storage-timeout$"):
                _render_all(late, TINY, plan(TINY), lambda done: None, NetworkGuard.of(late, "--output"))
            # each image through a mount at 3 s a request takes 9 s or more (create, write, rename), the 12 over
            # 100 s; given up, the worker is ended once its one request in the FUSE daemon's hands is answered
            assert time.monotonic() - started < 30
        assert not list((served / "late").rglob("*.jpg"))  # the worker was ended before it put one in place
    finally:
        location.set_timeout(location.DEFAULT_TIMEOUT_S)


def test_synthetic_output_that_stops_answering_is_one_line(tmp_path):
    served, mount = tmp_path / "served", tmp_path / "mnt"
    served.mkdir()
    mount.mkdir()
    with emulate(served, kind="mount", mount_point=mount, latency_s=3.0, writable=True, max_duration_s=LIMIT_S):
        done = subprocess.run([sys.executable, "-m", "stallscope", "prepare", "synthetic", "--output", str(mount / "images"),
                               "--classes", "2", "--images-per-class", "4", "--long-side", "48-64",
                               "--storage-timeout", "0.5"],
                              capture_output=True, text=True, timeout=60, env=child_environment())
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0] == (f"stallscope prepare: error: --output: the file system ({lines[0].split('(')[1].split(')')[0]}) "
                        f"creating {str(mount / 'images')!r} did not answer for 0.5 s; expected it within --storage-timeout")
