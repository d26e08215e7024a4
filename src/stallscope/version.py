"""stallscope's version, below every part: the package's `__version__`, `--version` and a run's summary."""

__version__ = "0.1.0"
