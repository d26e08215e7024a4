"""Latency and bandwidth as people write them (10ms, 0, 200Mbit, 1Gbit, 25MB/s), parsed to numbers.

Both raise ValueError with the expected form, for flag types and option parsers to wrap.
"""

from __future__ import annotations

import re

_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
# network rates are decimal; 'bit' and 'bps' units are bits, 'B/s' units (capital B) are bytes
_SCALES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
_NUMBER = r"\s*([0-9]+(?:\.[0-9]+)?)\s*"


def parse_latency(text: str) -> float:
    """Seconds of latency: '10ms', '0.5s', '250us', or '0' (none). A bare number is seconds."""
    match = re.fullmatch(_NUMBER + r"([a-zµ]*)\s*", str(text).lower())
    if not match or match.group(2) not in _TIME_UNITS:
        raise ValueError(f"expected a latency such as 10ms, 0.5s or 0, got {text!r}")
    return float(match.group(1)) * _TIME_UNITS[match.group(2)]


def parse_bandwidth(text: str) -> float:
    """Bits per second: '200Mbit', '1Gbit', '500kbps', or bytes with a capital B: '25MB/s'."""
    match = re.fullmatch(_NUMBER + r"([kKmMgG]?)(bit|Bit|bps|B/s)\s*", str(text))
    if not match:
        raise ValueError(f"expected a bandwidth such as 200Mbit, 1Gbit or 25MB/s, got {text!r}")
    value = float(match.group(1)) * _SCALES[match.group(2).lower()] * (8 if match.group(3) == "B/s" else 1)
    if not value > 0:
        raise ValueError(f"expected a bandwidth above 0, got {text!r}")
    return value


def format_latency(seconds: float) -> str:
    return "none" if not seconds else f"{seconds * 1e3:g} ms"


def format_bandwidth(bits_per_s: float | None) -> str:
    if not bits_per_s:
        return "unlimited"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g} {unit}"
    return f"{bits_per_s:g} bit/s"
