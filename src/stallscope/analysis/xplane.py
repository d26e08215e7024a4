"""Loads a TF profile (`*.xplane.pb`) into plain Python events with names, stats and absolute times.

The XSpace proto stores names and stat keys once per plane (metadata tables) and event times as
offsets from their line's start; every consumer needs them resolved, so that happens here, once.
Times are kept in integer picoseconds (the proto's unit) until a caller turns them into ms.

A file's top-level framing is checked before it is read whole (`framing_problem`: a few reads, however
large the file): a gigabyte of something else named `*.xplane.pb` took 12 s and 1.65 GB to refuse, and a
capture TF is still writing (its file cut short, its size still changing) is named as such, with the
newest complete capture beside it, instead of "not a readable XSpace profile".
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from stallscope.errors import DataError, UsageError
from stallscope.tfprotos import XPLANE, tf_proto
from stallscope.workload.rundir import PROFILE_DIR

log = logging.getLogger(__name__)

XPLANE_SUFFIX = ".xplane.pb"
HOST_PLANE = "/host:CPU"
# XSpace's top-level fields, as tag bytes: planes (1), errors (2), warnings (3), hostnames (4), each
# length-delimited (wire type 2).
_XSPACE_TAGS = frozenset({0x0A, 0x12, 0x1A, 0x22})
# A file cut short is taken as still being written when its size changes within this look, or it was
# modified this recently (TF writes a capture's file in one go, at the end of the profiled window).
GROWTH_LOOK_S = 0.5
RECENT_WRITE_S = 10.0


@dataclasses.dataclass(frozen=True)
class Event:
    """One traced region on one thread: metadata name (the long name for `Iterator::` events)."""

    name: str
    display_name: str
    start_ps: int
    duration_ps: int
    stats: Mapping[str, Any]
    line: str

    @property
    def end_ps(self) -> int:
        return self.start_ps + self.duration_ps

    def stat(self, key: str, default: Any = None) -> Any:
        return self.stats.get(key, default)


@dataclasses.dataclass(frozen=True)
class Line:
    """A thread's timeline, events sorted by start time (parents before their children)."""

    id: int
    name: str
    events: tuple[Event, ...]


@dataclasses.dataclass(frozen=True)
class Plane:
    name: str
    lines: tuple[Line, ...]
    stats: Mapping[str, Any]

    def events(self) -> Iterator[Event]:
        for line in self.lines:
            yield from line.events


@dataclasses.dataclass(frozen=True)
class Profile:
    """A loaded capture: the file it came from and its planes (host CPU first when present)."""

    path: Path
    planes: tuple[Plane, ...]
    hostnames: tuple[str, ...]

    @property
    def host(self) -> Plane:
        for plane in self.planes:
            if plane.name == HOST_PLANE:
                return plane
        raise DataError(f"{self.path}: no {HOST_PLANE} plane in this profile; was it captured on the host?")

    def events(self) -> Iterator[Event]:
        for plane in self.planes:
            yield from plane.events()


def find_captures(path: Path | str) -> list[Path]:
    """Every capture directory under `path` (`**/plugins/profile/<capture>/` holding a profile),
    oldest first: Keras writes `LOG/train/...` and `LOG/validation/...`, a run writes `RUN/...`.

    Capture names are timestamps, so the name orders them; the path breaks ties.
    Files under hidden folders are left out: `stallscope capture` writes into `.capture-partial-*/`
    and moves a capture into place only once it is complete.
    """
    path = Path(path)
    if any(path.glob(f"*{XPLANE_SUFFIX}")):
        return [path]
    found = {file.parent for file in path.rglob(f"*{XPLANE_SUFFIX}")
             if not any(part.startswith(".") for part in file.relative_to(path).parent.parts)}
    return sorted(found, key=lambda capture: (capture.name, str(capture)))


def find_profile(path: Path | str, *, capture: str | None = None) -> Path:
    """The `.xplane.pb` to read: the file itself, or the first host file of the newest capture
    found anywhere under a directory (`capture` names another one; see `find_captures`).

    A capture of several hosts has one file per host; `capture_files` lists them all.
    """
    return capture_files(path, capture=capture)[0]


def capture_files(path: Path | str, *, capture: str | None = None) -> list[Path]:
    """The host files of the chosen capture, in name order (one per host)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"RUN_DIR_OR_PROFILE: {str(path)!r} does not exist")
    if path.is_file():
        if not path.name.endswith(XPLANE_SUFFIX):
            raise UsageError(f"RUN_DIR_OR_PROFILE: {str(path)!r} is not a TF profile (expected a *{XPLANE_SUFFIX} file)")
        return [path]
    captures = find_captures(path)
    if not captures:
        raise DataError(
            f"{path}: no TF profile found (looked for *{XPLANE_SUFFIX} anywhere under it, e.g. in "
            f"{PROFILE_DIR}/*/ or train/{PROFILE_DIR}/*/); capture one with "
            "`stallscope train --log_path DIR --profile_steps 10:20`"
        )
    chosen = captures[-1]
    if capture is not None:
        named = [c for c in captures if c.name == capture or str(c.relative_to(path)) == capture]
        if not named:
            names = ", ".join(str(c.relative_to(path)) for c in captures)
            raise UsageError(f"--capture: no capture {capture!r} under {path} (found: {names})")
        chosen = named[-1]
    files = sorted(chosen.glob(f"*{XPLANE_SUFFIX}"))
    if capture is None and (writing := _being_written(files)) is not None:
        complete = [c for c in captures[:-1] if _being_written(sorted(c.glob(f"*{XPLANE_SUFFIX}")), look=False) is None]
        newest = (f"the newest complete capture is {complete[-1]}: `--capture {complete[-1].relative_to(path)}` reads it"
                  if complete else "there is no complete capture beside it yet: wait until it is written")
        raise DataError(f"{writing}: this capture is still being written ({XPLANE_SUFFIX} cut short, "
                        f"{os.path.getsize(writing):,} bytes so far); {newest}")
    return files


def framing_problem(file: Path) -> tuple[str, bool] | None:
    """What is wrong with the top-level framing of an XSpace file, and whether it is only cut short
    (the last field runs past the end); None when every top-level field fits. Reads 11 bytes a field
    (a capture has a few planes), never the whole file."""
    size = file.stat().st_size
    pos = 0
    with open(file, "rb") as stream:
        while pos < size:
            stream.seek(pos)
            head = stream.read(11)  # a tag byte and a length varint of up to 10 bytes
            if head[0] not in _XSPACE_TAGS:
                return f"byte {pos} is 0x{head[0]:02x}, not the start of an XSpace field", False
            length, shift, used = 0, 0, 0
            for used, byte in enumerate(head[1:], start=1):
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            else:
                if len(head) < 11:  # the length itself runs past the end
                    return f"the field at byte {pos} is cut short", True
                return f"the field at byte {pos} has no valid length", False
            end = pos + 1 + used + length
            if end > size:
                return f"the field at byte {pos} needs {end - size:,} bytes past its end", True
            pos = end
    return None


def _being_written(files: list[Path], *, look: bool = True) -> Path | None:
    """The first of a capture's files that is cut short while it is still being written (its size
    changes within GROWTH_LOOK_S, or it was modified within RECENT_WRITE_S); with look=False, the
    first cut short at all."""
    for file in files:
        problem = framing_problem(file)
        if problem is None or not problem[1]:
            continue
        if not look:
            return file
        before = file.stat()
        if time.time() - before.st_mtime < RECENT_WRITE_S:
            return file
        time.sleep(GROWTH_LOOK_S)
        if file.stat().st_size != before.st_size:
            return file
    return None


def load_profile(path: Path | str) -> Profile:
    """Parses a profile (or finds one, see `find_profile`) and resolves every name and stat."""
    file = find_profile(path)
    problem = framing_problem(file)
    if problem is not None:
        what, cut_short = problem
        if cut_short and _being_written([file]) is not None:
            raise DataError(f"{file}: this capture is still being written ({what}); analyse it once it is complete")
        hint = " (a capture stopped while it was written?)" if cut_short else ""
        raise DataError(f"{file}: not a readable XSpace profile ({what}){hint}")
    xplane_pb2 = tf_proto(XPLANE, "reading a profile")
    space = xplane_pb2.XSpace()
    try:
        space.ParseFromString(file.read_bytes())
    except Exception as exc:  # protobuf raises DecodeError, a bare Exception subclass
        raise DataError(f"{file}: not a readable XSpace profile ({exc})") from None
    planes = tuple(_convert_plane(plane) for plane in space.planes)
    if not any(plane.lines for plane in planes):
        raise DataError(f"{file}: the profile holds no events (was the profiler stopped before any step ran?)")
    return Profile(path=file, planes=planes, hostnames=tuple(space.hostnames))


def _convert_plane(plane: Any) -> Plane:
    stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
    event_meta = {key: (meta.name, meta.display_name) for key, meta in plane.event_metadata.items()}

    def resolve(stats: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for stat in stats:
            kind = stat.WhichOneof("value")
            if kind is None:
                continue
            value = getattr(stat, kind)
            if kind == "ref_value":
                value = stat_names.get(value, "")
            elif kind == "bytes_value":
                value = bytes(value)
            out[stat_names.get(stat.metadata_id, str(stat.metadata_id))] = value
        return out

    lines = []
    for line in plane.lines:
        base_ps = line.timestamp_ns * 1000
        label = line.display_name or line.name
        events = []
        for event in line.events:
            name, display = event_meta.get(event.metadata_id, ("", ""))
            events.append(Event(
                name=name, display_name=display or name, start_ps=base_ps + event.offset_ps,
                duration_ps=event.duration_ps, stats=resolve(event.stats) if event.stats else {}, line=label,
            ))
        events.sort(key=lambda e: (e.start_ps, -e.duration_ps))
        lines.append(Line(id=line.id, name=label, events=tuple(events)))
    return Plane(name=plane.name, lines=tuple(lines), stats=resolve(plane.stats))


def ps_to_ms(value: float) -> float:
    return value / 1e9
