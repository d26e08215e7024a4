"""/proc/self/mountinfo's fields, below every part: the CPU limits (cgroup mounts) and storage (network
file systems) both read it."""

from __future__ import annotations


def unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as an octal escape."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field
