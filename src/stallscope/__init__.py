"""stallscope: find, explain and remove input-pipeline stalls in TensorFlow fine-tuning."""

import os as _os

# TensorFlow's C++ start-up chatter hides our output; users can still set their own level.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
