"""/proc/self/mountinfo's fields, below every part: the CPU limits (cgroup mounts) and storage (network
file systems) both read it."""

from __future__ import annotations

from typing import NamedTuple


class Mount(NamedTuple):
    """One line of mountinfo: the path of the mount's root within its file system, the mount point,
    the file system type, and its super options (None where the line has none)."""

    root: str
    point: str
    fstype: str
    super_options: tuple[str, ...] | None


def mounts(text: str) -> list[Mount]:
    """The mounts of a mountinfo text, in its order; lines without the fields (mount ID, parent ID,
    major:minor, root, mount point, ..., " - ", type, ...) are left out."""
    found = []
    for line in text.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) >= 5 and tail:
            options = tuple(tail[2].split(",")) if len(tail) >= 3 else None
            found.append(Mount(unescape(fields[3]), unescape(fields[4]), tail[0], options))
    return found


def unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as an octal escape."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field
