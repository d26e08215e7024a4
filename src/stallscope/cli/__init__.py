"""Command-line interface: one module per subcommand, each with `add_parser` and `run`.

Subcommand modules must not import TensorFlow at module level, so `stallscope --help` stays fast.
"""
