"""A TF profile of a window of training steps, with the step markers xprof needs.

xprof finds steps only in traces marked `tf.profiler.experimental.Trace('train', step_num=i, _r=1)`
(Keras' own profile callback gives "No step time measured"), so each step in the window, both the
get_next and the model step, runs inside such a marker. The profile is written to
`LOG_DIR/plugins/profile/<timestamp>/<host>.xplane.pb`; open it with `tensorboard --logdir LOG_DIR`,
Profile tab (the Input Pipeline Analyzer shows step time and input time).

Outside the window no marker is created, so unprofiled steps pay nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from pathlib import Path

from stallscope.errors import UsageError

log = logging.getLogger(__name__)

STEP_TRACE_NAME = "train"
_WINDOW = re.compile(r"\s*([0-9]+)\s*[:,-]\s*([0-9]+)\s*")
CAPTURE_NAME_FORMAT = "%Y_%m_%d_%H_%M_%S"   # TF names a capture folder by the local time it is written
_NAME_WAIT_S = 1.5


@dataclasses.dataclass(frozen=True)
class ProfileWindow:
    """Global steps start..stop (inclusive, 1-based) to capture."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if self.start < 1 or self.stop < self.start:
            raise UsageError(f"--profile-steps: expected START:STOP with 1 <= START <= STOP, got {self.start}:{self.stop}")

    def __contains__(self, step: int) -> bool:
        return self.start <= step <= self.stop

    @property
    def text(self) -> str:
        return f"{self.start}:{self.stop}"


def parse_profile_steps(text: str) -> ProfileWindow:
    """'10:20' (also '10-20' or '10,20'): profile global steps 10 to 20; a single '15' is one step."""
    text = str(text)
    if text.strip().isdigit():
        return ProfileWindow(int(text), int(text))
    match = _WINDOW.fullmatch(text)
    if not match:
        raise UsageError(f"--profile-steps: expected START:STOP such as 10:20, got {text!r}")
    return ProfileWindow(int(match.group(1)), int(match.group(2)))


class StepProfiler:
    """Starts the TF profiler before the window's first step and stops it after its last.

    Use `with profiler.step(i):` around each step's get_next and model step. After `stop`, `capture` is
    the folder the profile went to (LOG_DIR/plugins/profile/<capture>), so a caller analyses its own
    capture and not a later one in the same LOG_DIR.
    """

    def __init__(self, window: ProfileWindow | None, log_dir: Path, *, owner: str = "--profile-steps") -> None:
        self.window = window
        self.log_dir = Path(log_dir)
        self.owner = owner  # what a user set the window with, for the error that names it
        self.active = False
        self.captured_steps = 0
        self.capture: Path | None = None
        self._earlier: set[Path] = set()

    @contextlib.contextmanager
    def step(self, step: int, batches: int = 1):
        """`batches` > 1: the step runs batches step..step+batches-1 (Keras' steps_per_execution), and
        is profiled when any of them is in the window."""
        last = step + max(batches, 1) - 1
        if self.window is None:
            yield
            return
        if last >= self.window.start and step <= self.window.stop and not self.active:
            self._start()
        if not self.active:
            yield
            return
        import tensorflow as tf

        with tf.profiler.experimental.Trace(STEP_TRACE_NAME, step_num=step, _r=1):
            yield
        self.captured_steps += 1
        if last >= self.window.stop:
            self.stop()

    @property
    def captures_dir(self) -> Path:
        return self.log_dir / "plugins" / "profile"

    def _start(self) -> None:
        import tensorflow as tf

        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{self.owner}: the profile folder {str(self.log_dir)!r} cannot be made "
                             f"({exc.strerror or exc})") from None
        self._earlier = _capture_folders(self.captures_dir)
        try:
            tf.profiler.experimental.start(str(self.log_dir))
        except tf.errors.AlreadyExistsError:
            raise UsageError(f"{self.owner}: another TF profiler session is already running in this process") from None
        self.active = True
        log.info("profiling steps %s into %s", self.window.text, self.log_dir)

    def stop(self) -> None:
        """Writes the profile; safe to call when nothing is being captured (e.g. at the end of a run)."""
        if not self.active:
            return
        import tensorflow as tf

        _wait_for_a_free_capture_name(self.captures_dir)
        tf.profiler.experimental.stop()
        self.active = False
        self.capture = _new_capture(self.captures_dir, self._earlier)
        log.info("profile of %d step(s) written under %s", self.captured_steps, self.capture or self.captures_dir)


def _capture_folders(root: Path) -> set[Path]:
    return {p for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()


def _wait_for_a_free_capture_name(root: Path) -> None:
    """TF names a capture by the second it is written, so a second capture in the same second would
    overwrite the first one's file: wait (at most a second) for a name that is free."""
    deadline = time.monotonic() + _NAME_WAIT_S
    while (root / time.strftime(CAPTURE_NAME_FORMAT)).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _new_capture(root: Path, earlier: set[Path]) -> Path | None:
    """The capture folder TF just wrote: the one that was not there before (else the newest)."""
    new = sorted(_capture_folders(root) - earlier) or sorted(_capture_folders(root))
    return new[-1] if new else None
