"""stallscope's version, below every part: the package's `__version__`, `--version` and a run's summary.

Read from the installed package's metadata, so pyproject.toml's `version` is the one place it is set.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stallscope")
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
