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
from pathlib import Path

from stallscope.errors import UsageError

log = logging.getLogger(__name__)

STEP_TRACE_NAME = "train"
_WINDOW = re.compile(r"\s*([0-9]+)\s*[:,-]\s*([0-9]+)\s*")


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

    Use `with profiler.step(i):` around each step's get_next and model step.
    """

    def __init__(self, window: ProfileWindow | None, log_dir: Path, *, owner: str = "--profile-steps") -> None:
        self.window = window
        self.log_dir = Path(log_dir)
        self.owner = owner  # what a user set the window with, for the error that names it
        self.active = False
        self.captured_steps = 0

    @contextlib.contextmanager
    def step(self, step: int):
        if self.window is None:
            yield
            return
        if step in self.window and not self.active:
            self._start()
        if not self.active:
            yield
            return
        import tensorflow as tf

        with tf.profiler.experimental.Trace(STEP_TRACE_NAME, step_num=step, _r=1):
            yield
        self.captured_steps += 1
        if step >= self.window.stop:
            self.stop()

    def _start(self) -> None:
        import tensorflow as tf

        self.log_dir.mkdir(parents=True, exist_ok=True)
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

        tf.profiler.experimental.stop()
        self.active = False
        log.info("profile of %d step(s) written under %s", self.captured_steps, self.log_dir / "plugins" / "profile")
