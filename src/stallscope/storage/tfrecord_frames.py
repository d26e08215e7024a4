"""TFRecord's frame, as its readers and writers share it: `uint64 length | masked crc32c(length) | data |
masked crc32c(data)`. Below records/ (the writer, the verifier) and the tf.data readers for stores alike.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterator

from google_crc32c import extend as crc32c_extend, value as crc32c  # noqa: F401 (the frame's checksum)

# Larger than any sane record; a bigger length means the header itself is garbage.
MAX_RECORD_BYTES = 1 << 31
_MASK_DELTA = 0xA282EAD8
LENGTH = struct.Struct("<Q")  # a frame's length field
CRC = struct.Struct("<I")  # a frame's masked checksums
HEADER_BYTES = LENGTH.size + CRC.size
FOOTER_BYTES = CRC.size


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: crc32c rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _mask(crc: int) -> int:
    """`masked_crc32c` of the data a crc32c was computed over (readers call that one: no extra call)."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


class FrameError(ValueError):
    """The framing cannot be read past this frame. `kind`: "truncated header" (`got` bytes of one),
    "length checksum", "implausible length" or "truncated record" (a frame of `length` bytes of data
    that the shard ends inside); `record`: the frame's index, `offset`: its first byte. Each caller
    words its own line (the verifier's report, the reader's error)."""

    def __init__(self, kind: str, record: int, offset: int, *, got: int = 0, length: int = 0) -> None:
        super().__init__(f"{kind} at byte {offset}")
        self.kind, self.record, self.offset, self.got, self.length = kind, record, offset, got, length


@dataclasses.dataclass(frozen=True)
class Frame:
    index: int
    offset: int  # of the frame's first byte
    payload: bytes
    data_crc_ok: bool


def read_frames(read: Callable[[int], bytes]) -> Iterator[Frame]:
    """The frames of a shard whose bytes `read(n)` gives in order (fewer than n only at its end): each
    with whether its data checksum holds (the length was sound, so a reader may go on past a bad one).
    A bad length checksum, an implausible length or a shard that ends inside a frame is a FrameError:
    nothing after it can be trusted."""
    offset = index = 0
    while True:
        header = read(HEADER_BYTES)
        if not header:
            return
        if len(header) < HEADER_BYTES:
            raise FrameError("truncated header", index, offset, got=len(header))
        length_bytes = header[:LENGTH.size]
        if CRC.unpack_from(header, LENGTH.size)[0] != masked_crc32c(length_bytes):
            raise FrameError("length checksum", index, offset)
        (length,) = LENGTH.unpack(length_bytes)
        if length > MAX_RECORD_BYTES:
            raise FrameError("implausible length", index, offset, length=length)
        payload = read(length)
        footer = read(FOOTER_BYTES) if len(payload) == length else b""
        if len(footer) < FOOTER_BYTES:
            raise FrameError("truncated record", index, offset, length=length)
        yield Frame(index, offset, payload, CRC.unpack(footer)[0] == masked_crc32c(payload))
        offset += HEADER_BYTES + length + FOOTER_BYTES
        index += 1
