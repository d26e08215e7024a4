"""Judging one image by its content and turning it into a JPEG that TensorFlow decodes as RGB.

Every image is sniffed by its magic bytes (never its extension) and decoded once. A JPEG is kept
byte for byte only when TF's `decode_jpeg` reads it as the same RGB picture: a baseline or
progressive 8-bit, 3-channel JPEG with no EXIF rotation. Such a plain JPEG is read from its markers
and decoded by libjpeg-turbo directly (`plain_jpeg_size`, `libjpeg_verdict`); any other file, and
any JPEG libjpeg warns of, is opened and decoded by Pillow. Everything else that decodes (PNG, GIF,
BMP, WebP, TIFF, CMYK, grayscale, palette, alpha, 16-bit, rotated, too large for `max_side`) is
re-encoded as RGB JPEG and the actions are listed. What cannot be used raises
`UnusableImage` with a short reason (the manifest groups by it) and a detail.

The check of a JPEG that is kept ("stream", the default) decodes its whole compressed stream, every
scan and every block's coefficients, but has libjpeg-turbo rebuild pixels at 1/8 scale and in grey
only (the chroma blocks are entropy-decoded but not transformed; 4% less time than RGB). Damage
(truncation, a bad Huffman code, a broken marker) is found in the entropy-coded data, which this
decodes in full; the inverse DCT and colour conversion that a full decode adds are arithmetic that
cannot fail. It gives the same verdict as `check="full"` (tested on damaged files) for 0.45x its
instructions (4.3 against 9.6 million per 78 KB JPEG, under callgrind). Images that are re-encoded
are always decoded in full.

Re-encoding a JPEG keeps the source's quantisation tables and chroma subsampling (its quality;
`jpeg_quality="keep"`, the default), so a downscaled or rotated image is not inflated by a blanket
high quality; other formats are written at `DEFAULT_JPEG_QUALITY`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import re
import warnings

from stallscope.config import require_choice, require_positive
from stallscope.errors import UsageError

# Pillow's own decompression-bomb threshold; a larger picture is refused unless the user raises it.
DEFAULT_MAX_PIXELS = 89_478_485
DEFAULT_JPEG_QUALITY = 95  # for sources that are not JPEG, or JPEGs whose tables cannot be reused
KEEP_QUALITY = "keep"
DRAFT_GAP = 2  # a JPEG downscaled by more than this is first decoded at a reduced DCT scale
CHECK_CHOICES = ("stream", "full")

# Short reasons, shared with the manifest and the convert summary.
EMPTY = "empty file"
NOT_AN_IMAGE = "not an image"
UNSUPPORTED = "unsupported image format"
CORRUPT = "truncated or corrupt image"
TOO_LARGE = "too large to decode"

# (format, magic test). Order matters only for readability; the tests are disjoint.
_MAGIC = (
    ("JPEG", lambda b: b[:3] == b"\xff\xd8\xff"),
    ("PNG", lambda b: b[:8] == b"\x89PNG\r\n\x1a\n"),
    ("GIF", lambda b: b[:6] in (b"GIF87a", b"GIF89a")),
    ("BMP", lambda b: b[:2] == b"BM" and len(b) >= 26),
    ("WEBP", lambda b: b[:4] == b"RIFF" and b[8:12] == b"WEBP"),
    ("TIFF", lambda b: b[:4] in (b"II*\x00", b"MM\x00*")),
    ("HEIF", lambda b: b[4:8] == b"ftyp" and b[8:12] in (b"heic", b"heix", b"hevc", b"mif1", b"msf1")),
    ("AVIF", lambda b: b[4:8] == b"ftyp" and b[8:12] in (b"avif", b"avis")),
)
# JPEG frame types libjpeg-turbo in TF decodes: baseline, extended sequential, progressive (Huffman).
_TF_JPEG_FRAMES = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive"}
_SOF_MARKERS = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_EXIF_ORIENTATION = 0x0112


class UnusableImage(Exception):
    """This file cannot become a training example; `reason` is one of the short reasons above."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """How images are checked and repaired: `max_side` downscales (None keeps the size);
    `jpeg_quality` of re-encoded images, 1..100 or "keep" (a JPEG source's own tables); `check`
    "stream" or "full" for JPEGs kept byte for byte (see the module docstring)."""

    max_side: int | None = None
    jpeg_quality: int | str = KEEP_QUALITY
    max_pixels: int = DEFAULT_MAX_PIXELS
    check: str = "stream"

    def __post_init__(self) -> None:
        require_positive("max_side", self.max_side, allow_none=True)
        require_positive("max_pixels", self.max_pixels)
        require_choice("check", self.check, CHECK_CHOICES)
        quality = self.jpeg_quality
        if quality != KEEP_QUALITY and (isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100):
            raise UsageError(f"jpeg_quality: expected an integer in 1..100 or 'keep', got {quality!r}")


@dataclasses.dataclass(frozen=True)
class PreparedImage:
    data: bytes  # JPEG bytes TF decodes as RGB
    width: int
    height: int
    source_format: str  # what the content was: JPEG, PNG, ...
    actions: tuple[str, ...] = ()  # empty when the original bytes were kept

    @property
    def repaired(self) -> bool:
        return bool(self.actions)


def sniff_format(data: bytes) -> str | None:
    """The image format named by the magic bytes, or None."""
    for name, test in _MAGIC:
        if test(data):
            return name
    return None


def _segments(data: bytes):
    """(marker, segment) of each marker of a JPEG's header in order, the segment None for a marker
    without one; stops at the start of scan or the end of image, or where the markers stop making sense."""
    pos, end = 2, len(data)
    while pos + 4 <= end and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:
            yield marker, None
            pos += 2
        elif marker in (0xD9, 0xDA):
            return
        else:
            length = int.from_bytes(data[pos + 2:pos + 4], "big")
            yield marker, data[pos + 4:pos + 2 + length]
            pos += 2 + length


def jpeg_frame(data: bytes) -> tuple[int, int, int] | None:
    """(SOF marker, sample precision, components) of a JPEG, read from its markers; None if not found."""
    for marker, segment in _segments(data):
        if marker in _SOF_MARKERS:
            return (marker, segment[0], segment[5]) if len(segment) >= 6 else None
    return None


def _tf_keeps_jpeg(data: bytes) -> str | None:
    """None when TF decodes this JPEG as is; else why it must be re-encoded."""
    frame = jpeg_frame(data)
    if frame is None:
        return "JPEG without a readable frame header"
    marker, precision, _ = frame
    if marker not in _TF_JPEG_FRAMES:
        return f"JPEG frame type 0x{marker:02X} (lossless, arithmetic or hierarchical) TensorFlow cannot decode"
    if precision != 8:
        return f"{precision}-bit JPEG"
    return None  # other channel counts (grayscale, CMYK) are reported by the mode check


_EXIF_HEADER = b"Exif\x00\x00"
_XMP_HEADER = b"http://ns.adobe.com/xap/1.0/\x00"
_MPF_HEADER = b"MPF\x00"


def plain_jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a JPEG that TF decodes as the picture it is, read from its markers alone:
    a baseline, extended or progressive 8-bit frame of 3 components, one picture (no MPF index), no
    EXIF or XMP orientation other than 1. None where any of that is not plainly so: such a file takes
    Pillow's reading, which re-encodes what needs it. Pillow's opening of the same header cost ~0.7
    million instructions per image, ~14% of the stream check."""
    orientation_seen = False
    for marker, segment in _segments(data):
        if segment is None:  # restart or TEM markers before the frame: not a plain JPEG
            return None
        if marker == 0xE1 and segment.startswith(_EXIF_HEADER):
            if orientation_seen or _exif_segment_orientation(segment[len(_EXIF_HEADER):]) != 1:
                return None  # Pillow reads the first EXIF block: a second one is left to it
            orientation_seen = True
        elif marker == 0xE1 and segment.startswith(_XMP_HEADER) and b"Orientation" in segment:
            return None  # Pillow also takes an XMP tiff:Orientation
        elif marker == 0xE2 and segment.startswith(_MPF_HEADER):
            return None  # a multi-picture file: Pillow opens it as MPO, frames and all
        elif marker in _SOF_MARKERS:
            if marker not in _TF_JPEG_FRAMES or len(segment) < 6 or segment[0] != 8 or segment[5] != 3:
                return None
            height, width = int.from_bytes(segment[1:3], "big"), int.from_bytes(segment[3:5], "big")
            return (width, height) if width and height else None
    return None


def _exif_segment_orientation(tiff: bytes) -> int | None:
    """The orientation tag of an EXIF block's first IFD (1 when it has none); None where the block
    cannot be read plainly."""
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8 or int.from_bytes(tiff[2:4], order) != 42:
        return None
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return None
    count = int.from_bytes(tiff[ifd:ifd + 2], order)
    entries = tiff[ifd + 2:ifd + 2 + 12 * count]
    if len(entries) != 12 * count:
        return None
    for start in range(0, len(entries), 12):
        if int.from_bytes(entries[start:start + 2], order) == _EXIF_ORIENTATION:
            kind = int.from_bytes(entries[start + 2:start + 4], order)
            return int.from_bytes(entries[start + 8:start + 10], order) if kind == 3 else None  # SHORT
    return 1


@contextlib.contextmanager
def _pillow_pixel_limit(max_pixels: int):
    """Pillow refuses a picture above twice its global `MAX_IMAGE_PIXELS` at its opening, quoting its own
    limit (178,956,970) where `max_pixels` (--max-pixels) is the one that applies. Opening reads the
    header only, and our check of its size follows at once, so Pillow's is lifted while we open and
    decode: every picture above `max_pixels` is refused by ours, in its words."""
    from PIL import Image

    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


# libjpeg-turbo's verdicts on a JPEG's stream (`libjpeg_verdict`).
CLEAN = "clean"  # decoded with no warning: TensorFlow decodes it too
ENDS_EARLY = "ends early"  # the data ran out before the image did: TensorFlow refuses it
WARNED = "warned"  # any other warning or error: TensorFlow decodes through some warnings, not others
PREMATURE_END = "Premature end of JPEG file"  # libjpeg's warning when it had to invent the end


def libjpeg_verdict(data: bytes, *, scaled: bool = True) -> str:
    """CLEAN, ENDS_EARLY or WARNED for a JPEG to be kept byte for byte, from one strict
    libjpeg-turbo decode (simplejpeg) of its whole compressed stream; `scaled` rebuilds grey pixels at
    1/8 scale (the stream check), else every RGB pixel (the full check).

    Why not Pillow alone: Pillow's reader invents the end of a stream that ends early, where
    TensorFlow's reader stops, so it kept files that training then refused; and with the marker walk
    of `plain_jpeg_size` instead of Pillow's opening, a 78 KB JPEG's check takes 4.5 million
    instructions instead of 5.2 (callgrind; the decode itself is 4.3). A strict decode says nothing of
    which warning it met after the first, so a WARNED file gets Pillow's verdict."""
    import simplejpeg

    try:
        if scaled:
            simplejpeg.decode_jpeg(data, colorspace="GRAY", min_height=1, min_width=1, min_factor=8, strict=True)
        else:
            simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    except Exception as exc:  # simplejpeg raises ValueError with libjpeg's message
        return ENDS_EARLY if str(exc).startswith(PREMATURE_END) else WARNED
    return CLEAN


def _kept_by_verdict(data: bytes, verdict: str, width: int, height: int) -> PreparedImage | None:
    """The JPEG kept as it is (CLEAN), refused (ENDS_EARLY), or None: Pillow's verdict decides (WARNED)."""
    if verdict == ENDS_EARLY:
        raise UnusableImage(CORRUPT, f"JPEG: {PREMATURE_END}")
    return PreparedImage(data, width, height, "JPEG") if verdict == CLEAN else None


def prepare_image(data: bytes, options: ImageOptions = ImageOptions()) -> PreparedImage:
    """Checks and, where needed, repairs one image. Raises UnusableImage when it cannot be used."""
    from PIL import Image, ImageOps

    if not data:
        raise UnusableImage(EMPTY)
    fmt = sniff_format(data)
    if fmt is None:
        raise UnusableImage(NOT_AN_IMAGE, f"content starts with {data[:8].hex()}")
    verdict = None  # libjpeg's, for a JPEG kept byte for byte
    size = plain_jpeg_size(data) if fmt == "JPEG" else None
    if size and size[0] * size[1] <= options.max_pixels and not (options.max_side and max(size) > options.max_side):
        verdict = libjpeg_verdict(data, scaled=options.check == "stream")
        if kept := _kept_by_verdict(data, verdict, *size):
            return kept
    # Pillow's warnings (a decompression bomb below our own limit, a truncated or odd file) are ignored:
    # each image's verdict is the exception it raises. One filter for the open and the decode.
    with _pillow_pixel_limit(options.max_pixels), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            image = Image.open(io.BytesIO(data), formats=[fmt])
        except Image.DecompressionBombError as exc:  # Pillow's limit, put back by another thread meanwhile
            found = re.search(r"\((\d+) pixels\)", str(exc))
            pixels = found.group(1) if found else "more"
            raise UnusableImage(TOO_LARGE, f"{pixels} pixels > limit {options.max_pixels}") from None
        except (ValueError, KeyError) as exc:  # Pillow has no plugin for this format
            raise UnusableImage(UNSUPPORTED, f"{fmt} ({exc})") from None
        except Exception as exc:  # Pillow raises a variety of errors for a broken header
            if fmt in ("HEIF", "AVIF"):
                raise UnusableImage(UNSUPPORTED, f"{fmt} is not readable here ({exc})") from None
            raise UnusableImage(CORRUPT, f"{fmt} header: {_without_addresses(exc)}") from None

        width, height = image.size
        if width * height > options.max_pixels:
            raise UnusableImage(TOO_LARGE, f"{width}x{height} = {width * height} pixels > limit {options.max_pixels}")
        if width == 0 or height == 0:
            raise UnusableImage(CORRUPT, f"{width}x{height} pixels")
        frames = getattr(image, "n_frames", 1)
        orientation = _exif_orientation(image)  # None: unreadable before decoding (read again after)
        actions: list[str] = []
        if fmt != "JPEG":
            actions.append(f"re-encoded {fmt} as JPEG")
        else:
            why = _tf_keeps_jpeg(data)
            if why:
                actions.append(f"re-encoded {why} as baseline JPEG")
        kept_as_is = (not actions and frames == 1 and orientation == 1 and image.mode == "RGB"
                      and not (options.max_side and max(width, height) > options.max_side))
        if kept_as_is:  # a JPEG whose markers plain_jpeg_size could not read plainly, or one libjpeg warned of
            verdict = verdict or libjpeg_verdict(data, scaled=options.check == "stream")
            if kept := _kept_by_verdict(data, verdict, width, height):
                return kept
        if kept_as_is and options.check == "stream":
            image.draft("L", (1, 1))  # the whole stream is decoded; grey pixels are rebuilt at 1/8 scale
        elif fmt == "JPEG" and options.max_side and max(width, height) > DRAFT_GAP * options.max_side:
            # A big JPEG that will be downscaled: libjpeg rebuilds it at 1/2, 1/4 or 1/8 scale, still at
            # least DRAFT_GAP times the target, and the Lanczos resize below does the rest (Pillow's
            # thumbnail() does the same); the whole stream is still decoded.
            gap = DRAFT_GAP * options.max_side / max(width, height)
            image.draft(None, (math.ceil(width * gap), math.ceil(height * gap)))
        try:
            image.load()  # the one decode; a truncated file raises here
        except Exception as exc:
            raise UnusableImage(CORRUPT, f"{fmt}: {exc}") from None
    if kept_as_is:
        return PreparedImage(data, width, height, fmt)

    source_tables = _reusable_jpeg_tables(image) if fmt == "JPEG" and options.jpeg_quality == KEEP_QUALITY else None
    if frames > 1:
        actions.append(f"kept the first of {frames} frames")
    if orientation is None:
        orientation = _exif_orientation(image) or 1
    if orientation != 1:
        image = ImageOps.exif_transpose(image)
        actions.append(f"applied EXIF orientation {orientation}")
    image, mode_action = _to_rgb(image)
    if mode_action:
        actions.append(mode_action)
    full_size = (width, height) if orientation not in (5, 6, 7, 8) else (height, width)  # after EXIF rotation
    if options.max_side and max(full_size) > options.max_side:
        old = full_size
        scale = options.max_side / max(old)
        new = (max(1, round(old[0] * scale)), max(1, round(old[1] * scale)))
        image = image.resize(new, Image.Resampling.LANCZOS, reducing_gap=3.0)
        actions.append(f"downscaled {old[0]}x{old[1]} to {new[0]}x{new[1]}")
    if not actions:  # nothing needed repair after all
        return PreparedImage(data, width, height, fmt)
    buffer = io.BytesIO()
    if source_tables is not None:
        tables, subsampling = source_tables
        image.save(buffer, "JPEG", qtables=tables, subsampling=subsampling)
    else:
        quality = DEFAULT_JPEG_QUALITY if options.jpeg_quality == KEEP_QUALITY else options.jpeg_quality
        image.save(buffer, "JPEG", quality=quality)
    return PreparedImage(buffer.getvalue(), image.size[0], image.size[1], fmt, tuple(actions))


_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


def _without_addresses(exc: Exception) -> str:
    """Pillow's message without the `<_io.BytesIO object at 0x7f...>` it names the stream by: a memory
    address would make the manifest differ between two runs of the same conversion."""
    return _OBJECT_REPR.sub("the data", str(exc))


def _exif_orientation(image) -> int | None:
    """The EXIF orientation (1 when absent), or None when the metadata cannot be read (yet)."""
    try:
        orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # Pillow reads some formats' metadata lazily and a damaged file fails there
        return None
    return orientation if isinstance(orientation, int) else 1


def _reusable_jpeg_tables(image) -> tuple[list, int] | None:
    """(quantisation tables, subsampling) of a colour JPEG source to write its repair with, so the
    repaired file keeps the source's quality; None where they do not fit an RGB JPEG (grayscale,
    CMYK, or tables Pillow did not read)."""
    from PIL import JpegImagePlugin

    tables = getattr(image, "quantization", None) or {}
    layers = getattr(image, "layers", 0)
    if layers != 3 or len(tables) < 2:
        return None
    subsampling = JpegImagePlugin.get_sampling(image)
    return [tables[key] for key in sorted(tables)][:2], (subsampling if subsampling >= 0 else 2)


def _to_rgb(image):
    """(RGB image, action or None). Alpha is flattened onto white so hidden pixels stay hidden."""
    from PIL import Image

    mode = image.mode
    if mode == "RGB":
        return image, None
    if mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    elif mode == "P":
        return image.convert("RGB"), "palette to RGB"
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background, f"{mode} alpha flattened onto white"
    if mode.startswith("I;16") or mode in ("I", "F"):
        import numpy as np

        pixels = np.asarray(image, dtype=np.float64)
        top = 65535.0 if mode.startswith("I;16") or pixels.max(initial=0) > 255 else 255.0
        eight = np.clip(pixels * (255.0 / top), 0, 255).astype(np.uint8)
        return Image.fromarray(eight, "L").convert("RGB"), f"{mode} high bit depth to 8-bit RGB"
    names = {"L": "grayscale", "1": "bilevel", "CMYK": "CMYK", "YCbCr": "YCbCr", "LAB": "Lab", "HSV": "HSV"}
    return image.convert("RGB"), f"{names.get(mode, mode)} to RGB"
