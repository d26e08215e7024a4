"""stallscope: find, explain and remove input-pipeline stalls in TensorFlow fine-tuning."""

import os as _os

# TensorFlow's C++ start-up chatter hides our output; users can still set their own level.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"


def step(number: int):
    """`with stallscope.step(i):` around each step of a custom loop marks it for the profiler."""
    from stallscope.workload.marking import step as _step

    return _step(number)


def profile(log_dir, steps=(10, 20)):
    """`with stallscope.profile(LOG, steps=(10, 20)):` captures those `stallscope.step`s; `.analyze()` after."""
    from stallscope.workload.marking import Profile

    return Profile(log_dir, steps)


def serve_profiler(port: int) -> int:
    """Starts TF's profiler server so `stallscope capture localhost:PORT` can attach to this job."""
    from stallscope.workload.marking import serve_profiler as _serve

    return _serve(port)
