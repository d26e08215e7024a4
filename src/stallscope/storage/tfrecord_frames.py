"""TFRecord's frame, as its readers and writers share it: `uint64 length | masked crc32c(length) | data |
masked crc32c(data)`. Below records/ (the writer, the verifier) and the tf.data readers for stores alike.
"""

from __future__ import annotations

import struct

# Larger than any sane record; a bigger length means the header itself is garbage.
MAX_RECORD_BYTES = 1 << 31
_MASK_DELTA = 0xA282EAD8
LENGTH = struct.Struct("<Q")  # a frame's length field
CRC = struct.Struct("<I")  # a frame's masked checksums
HEADER_BYTES = LENGTH.size + CRC.size
FOOTER_BYTES = CRC.size


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


def _crc32c_extend_python(crc: int, data: bytes) -> int:
    """Slow fallback for machines without the `google-crc32c` wheel: the crc32c of the bytes that gave
    `crc` followed by `data`, as `google_crc32c.extend`."""
    crc ^= 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc32c_python(data: bytes) -> int:
    return _crc32c_extend_python(0, data)


try:
    from google_crc32c import extend as crc32c_extend, value as crc32c
except ImportError:  # pragma: no cover - the wheel is installed with the package's dependencies
    _CRC32C_TABLE = _crc32c_table()
    crc32c, crc32c_extend = _crc32c_python, _crc32c_extend_python


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: crc32c rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _mask(crc: int) -> int:
    """`masked_crc32c` of the data a crc32c was computed over (readers call that one: no extra call)."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF
