"""Experiments: a grid of `stallscope train` runs with repeats, their medians, HParams and a report."""
