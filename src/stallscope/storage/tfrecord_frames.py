"""TFRecord's frame, as its readers and writers share it: `uint64 length | masked crc32c(length) | data |
masked crc32c(data)`. Below records/ (the writer, the verifier) and the tf.data readers for stores alike.
"""

from __future__ import annotations

import struct

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
