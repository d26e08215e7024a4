"""images.prepare_image: content sniffing, one full decode, repairs TensorFlow agrees with, clear skips."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from stallscope.data import images
from stallscope.data.images import ImageOptions, PreparedImage, UnusableImage, prepare_image
from stallscope.errors import UsageError


def _photo(size=(80, 60), seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    pixels = rng.uniform(0, 255, 3) + x[..., None] * 1.5 - y[..., None] * 1.0 + rng.normal(0, 10, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _tf_rgb(data: bytes):
    import tensorflow as tf

    return tf.io.decode_jpeg(data, channels=3).numpy()


def test_plain_and_progressive_jpegs_are_kept_byte_for_byte():
    for kwargs in ({}, {"progressive": True}):
        data = _encode(_photo(), "JPEG", **kwargs)
        prepared = prepare_image(data)
        assert prepared.data is data and not prepared.repaired
        assert (prepared.width, prepared.height, prepared.source_format) == (80, 60, "JPEG")


@pytest.mark.parametrize("fmt, kwargs, action", [
    ("PNG", {}, "re-encoded PNG as JPEG"),
    ("GIF", {}, "re-encoded GIF as JPEG"),
    ("BMP", {}, "re-encoded BMP as JPEG"),
    ("WEBP", {}, "re-encoded WEBP as JPEG"),
    ("TIFF", {}, "re-encoded TIFF as JPEG"),
])
def test_other_formats_become_rgb_jpeg_tf_decodes(fmt, kwargs, action):
    prepared = prepare_image(_encode(_photo(), fmt, **kwargs))
    assert action in prepared.actions and prepared.data[:3] == b"\xff\xd8\xff"
    assert _tf_rgb(prepared.data).shape == (60, 80, 3)


@pytest.mark.parametrize("mode, action", [("L", "grayscale to RGB"), ("CMYK", "CMYK to RGB")])
def test_grayscale_and_cmyk_jpegs_are_re_encoded(mode, action):
    photo = _photo()
    prepared = prepare_image(_encode(photo.convert(mode), "JPEG"))
    assert action in prepared.actions
    rgb = _tf_rgb(prepared.data)
    assert rgb.shape == (60, 80, 3)
    expected = np.asarray(photo.convert(mode).convert("RGB"), dtype=float)
    assert np.abs(rgb.astype(float) - expected).mean() < 12  # the colours survive, not just the shape


def test_alpha_is_flattened_onto_white_and_palette_transparency_too():
    rgba = Image.new("RGBA", (20, 10), (255, 0, 0, 0))  # fully transparent red
    prepared = prepare_image(_encode(rgba, "PNG"))
    assert any("alpha flattened onto white" in a for a in prepared.actions)
    assert _tf_rgb(prepared.data).min() > 240  # white, not the hidden red
    palette = Image.new("P", (20, 10), 0)
    palette.putpalette([0, 255, 0] * 256)
    prepared = prepare_image(_encode(palette, "PNG", transparency=0))
    assert _tf_rgb(prepared.data).min() > 240


def test_sixteen_bit_png_is_scaled_not_clipped():
    ramp = (np.linspace(0, 65535, 64 * 8).reshape(8, 64)).astype(np.uint16)
    prepared = prepare_image(_encode(Image.fromarray(ramp), "PNG"))
    rgb = _tf_rgb(prepared.data)
    assert any("high bit depth" in a for a in prepared.actions)
    assert rgb[..., 0].min() < 20 and rgb[..., 0].max() > 235 and 100 < rgb[..., 0].mean() < 155


def test_exif_orientation_is_applied():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    prepared = prepare_image(_encode(_photo((80, 60)), "JPEG", exif=exif.tobytes()))
    assert "applied EXIF orientation 6" in prepared.actions
    assert (prepared.width, prepared.height) == (60, 80) and _tf_rgb(prepared.data).shape == (80, 60, 3)


def test_max_side_downscales_keeping_aspect():
    prepared = prepare_image(_encode(_photo((400, 300)), "JPEG"), ImageOptions(max_side=100))
    assert "downscaled 400x300 to 100x75" in prepared.actions
    assert _tf_rgb(prepared.data).shape == (75, 100, 3)
    small = _encode(_photo((80, 60)), "JPEG")
    assert prepare_image(small, ImageOptions(max_side=100)).data is small


def test_animated_gif_keeps_first_frame():
    frames = [_photo(seed=1).convert("P"), _photo(seed=2).convert("P")]
    prepared = prepare_image(_encode(frames[0], "GIF", save_all=True, append_images=frames[1:]))
    assert "kept the first of 2 frames" in prepared.actions


def _png_claiming(width: int, height: int) -> bytes:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 32)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("data, reason", [
    (b"", images.EMPTY),
    (b"hello, I am text", images.NOT_AN_IMAGE),
    (b"<html><body>404</body></html>", images.NOT_AN_IMAGE),
    (_png_claiming(40000, 40000), images.TOO_LARGE),   # a decompression bomb: refused before decoding
    (_png_claiming(12000, 12000), images.TOO_LARGE),   # above our limit, below Pillow's hard one
    (b"\xff\xd8\xff\xe0" + b"\x00" * 20, images.CORRUPT),
])
def test_unusable_inputs_give_their_reason(data, reason):
    with pytest.raises(UnusableImage) as exc:
        prepare_image(data)
    assert exc.value.reason == reason


def test_truncated_files_are_corrupt_for_every_format():
    for fmt in ("JPEG", "PNG", "WEBP"):
        data = _encode(_photo(), fmt)
        with pytest.raises(UnusableImage) as exc:
            prepare_image(data[: len(data) // 2])
        assert exc.value.reason == images.CORRUPT, fmt


def test_max_pixels_is_configurable():
    data = _encode(_photo((80, 60)), "JPEG")
    with pytest.raises(UnusableImage, match="4800 pixels > limit 1000"):
        prepare_image(data, ImageOptions(max_pixels=1000))


def test_sniffing_and_jpeg_frames():
    assert images.sniff_format(_encode(_photo(), "PNG")) == "PNG"
    assert images.sniff_format(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "WEBP"
    assert images.sniff_format(b"\x00\x00\x00\x18ftypheic") == "HEIF"
    assert images.sniff_format(b"BM") is None  # too short to be a bitmap
    assert images.jpeg_frame(_encode(_photo(), "JPEG"))[:2] == (0xC0, 8)
    assert images.jpeg_frame(_encode(_photo(), "JPEG", progressive=True))[0] == 0xC2
    assert images.jpeg_frame(_encode(_photo().convert("L"), "JPEG"))[2] == 1
    assert images.jpeg_frame(b"\xff\xd8\xff\xd9") is None


def _exif(orientation: int | None, big_endian: bool = False) -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "camera"
    if orientation is not None:
        exif[0x0112] = orientation
    data = exif.tobytes()
    if big_endian:  # Pillow writes little-endian; the same IFD by hand in Motorola order
        entries = [(0x010F, 2, 7, b"came")]
        if orientation:
            entries.append((0x0112, 3, 1, struct.pack(">H", orientation) + b"\0\0"))
        body = struct.pack(">H", len(entries)) + b"".join(struct.pack(">HHI", t, k, n) + v for t, k, n, v in entries)
        data = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08" + body + b"\0\0\0\0"
    return data


def _jpeg_variants() -> dict[str, bytes]:
    photo = _photo((96, 64), seed=6)
    other = _photo((96, 64), seed=7)
    mpo = io.BytesIO()
    photo.save(mpo, "MPO", save_all=True, append_images=[other])
    xmp = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>'
    variants = {
        "plain": _encode(photo, "JPEG"),
        "progressive": _encode(photo, "JPEG", progressive=True),
        "grayscale": _encode(photo.convert("L"), "JPEG"),
        "cmyk": _encode(photo.convert("CMYK"), "JPEG"),
        "exif without orientation": _encode(photo, "JPEG", exif=_exif(None)),
        "exif big-endian, orientation 1": _encode(photo, "JPEG", exif=_exif(1, big_endian=True)),
        "exif big-endian, orientation 8": _encode(photo, "JPEG", exif=_exif(8, big_endian=True)),
        "xmp orientation": _encode(photo, "JPEG", xmp=xmp),
        "two pictures (MPO)": mpo.getvalue(),
        "exif block cut short": _encode(photo, "JPEG", exif=_exif(1)[:14]),
    }
    for orientation in range(1, 9):
        variants[f"exif orientation {orientation}"] = _encode(photo, "JPEG", exif=_exif(orientation))
    return variants


def test_plain_jpeg_size_reads_only_what_tensorflow_decodes_as_it_is():
    sizes = {name: images.plain_jpeg_size(data) for name, data in _jpeg_variants().items()}
    plain = {name for name, size in sizes.items() if size is not None}
    assert plain == {"plain", "progressive", "exif without orientation", "exif big-endian, orientation 1",
                     "exif orientation 1"}
    assert all(sizes[name] == (96, 64) for name in plain)


@pytest.mark.parametrize("options", [ImageOptions(), ImageOptions(check="full"), ImageOptions(max_side=80),
                                     ImageOptions(max_pixels=96 * 64)])
def test_reading_the_markers_gives_what_reading_through_pillow_gives(options, monkeypatch):
    variants = _jpeg_variants()
    variants.update({f"damaged {i}": d for i, d in enumerate(_damaged_variants(variants["plain"], 60, seed=4))})
    variants["larger"] = _encode(_photo((128, 64)), "JPEG")

    def outcome(data: bytes):
        try:
            prepared = prepare_image(data, options)
        except UnusableImage as exc:
            return exc.reason
        return prepared

    quick = {name: outcome(data) for name, data in variants.items()}
    monkeypatch.setattr(images, "plain_jpeg_size", lambda data: None)  # every JPEG opened by Pillow
    through_pillow = {name: outcome(data) for name, data in variants.items()}
    assert quick == through_pillow
    assert {type(o) for o in quick.values()} == {PreparedImage, str}  # kept, repaired and refused all met


@pytest.mark.parametrize("kwargs", [{"jpeg_quality": 0}, {"jpeg_quality": 101}, {"max_side": 0}, {"max_pixels": -1}])
def test_options_are_validated(kwargs):
    with pytest.raises(UsageError):
        ImageOptions(**kwargs)


def test_max_pixels_above_pillows_own_limit_applies():
    # 15000 x 15000 is above Pillow's hard limit (2 x 89,478,485): a higher max_pixels must let it
    # through to the decode (this header-only PNG then fails there as corrupt, not as too large).
    with pytest.raises(UnusableImage) as exc:
        prepare_image(_png_claiming(15000, 15000), ImageOptions(max_pixels=300_000_000))
    assert exc.value.reason == images.CORRUPT
    from PIL import Image

    assert Image.MAX_IMAGE_PIXELS == images.DEFAULT_MAX_PIXELS  # restored afterwards


def _damaged_variants(data: bytes, count: int, seed: int = 0):
    """Truncations, flipped bits and zeroed runs anywhere past the first bytes of a JPEG."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        damaged = bytearray(data)
        kind = index % 3
        if kind == 0:
            damaged = damaged[: int(rng.integers(20, len(data)))]
        elif kind == 1:
            for _ in range(int(rng.integers(1, 20))):
                position = int(rng.integers(20, len(data)))
                damaged[position] ^= 1 << int(rng.integers(0, 8))
        else:
            start = int(rng.integers(20, len(data) - 8))
            end = start + int(rng.integers(1, 64))
            damaged[start:end] = bytes(len(damaged[start:end]))
        yield bytes(damaged)


def _verdict(data: bytes, check: str) -> str:
    try:
        prepare_image(data, ImageOptions(check=check))
    except UnusableImage as exc:
        return exc.reason
    return "kept"


@pytest.mark.parametrize("progressive", [False, True])
def test_stream_check_gives_the_full_decodes_verdict_on_damaged_jpegs(progressive):
    data = _encode(_photo((160, 120), seed=3), "JPEG", quality=90, progressive=progressive)
    verdicts = [(_verdict(d, "stream"), _verdict(d, "full")) for d in _damaged_variants(data, 150)]
    assert all(stream == full for stream, full in verdicts), [v for v in verdicts if v[0] != v[1]]
    kinds = {full for _, full in verdicts}
    assert kinds == {"kept", images.CORRUPT}  # the sample holds both outcomes, so the comparison means something


def _tf_verdict(data: bytes) -> str:
    import tensorflow as tf

    try:
        tf.io.decode_jpeg(data, channels=3)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        return images.CORRUPT
    return "kept"


@pytest.mark.parametrize("progressive", [False, True])
def test_stream_check_keeps_exactly_what_tensorflow_decodes(progressive):
    # Training decodes with tf.io.decode_jpeg: a kept file it refuses would stop a run, and a refused
    # file it decodes would be lost. TF refuses truncation and broken markers but decodes through a
    # bad Huffman code; libjpeg-turbo bindings that raise on every warning (or on none) disagree here.
    data = _encode(_photo((160, 120), seed=5), "JPEG", quality=90, progressive=progressive)
    verdicts = [(_verdict(d, "stream"), _tf_verdict(d)) for d in _damaged_variants(data, 150, seed=1)]
    disagree = [v for v in verdicts if (v[0] == "kept") != (v[1] == "kept")]
    assert not disagree, disagree
    assert {tf for _, tf in verdicts} == {"kept", images.CORRUPT}


@pytest.mark.parametrize("check", ["stream", "full"])
def test_a_jpeg_that_ends_inside_a_marker_is_refused_as_tensorflow_refuses_it(check):
    # The end-of-image marker's last byte turned into a comment marker's: the file ends inside a marker.
    # Pillow's reader invents the end and keeps it; TF's reader runs out of data and refuses it, so a kept
    # copy would stop training at that record.
    data = _encode(_photo((160, 120), seed=2), "JPEG", quality=95)
    broken = data[:-1] + b"\xfe"
    image = Image.open(io.BytesIO(broken))
    image.draft("L", (1, 1))
    image.load()  # Pillow alone keeps it
    assert _tf_verdict(broken) == images.CORRUPT
    assert images.libjpeg_verdict(broken, scaled=check == "stream") == images.ENDS_EARLY
    with pytest.raises(UnusableImage, match="Premature end") as caught:
        prepare_image(broken, ImageOptions(check=check))
    assert caught.value.reason == images.CORRUPT


def test_libjpeg_verdicts_of_a_clean_a_cut_and_a_damaged_stream():
    data = _encode(_photo((160, 120), seed=4), "JPEG", quality=90)
    assert images.libjpeg_verdict(data) == images.libjpeg_verdict(data, scaled=False) == images.CLEAN
    assert images.libjpeg_verdict(data[: len(data) // 2]) == images.ENDS_EARLY
    zeroed = data[:600] + bytes(40) + data[640:]  # a run of zeros inside the entropy-coded data
    assert images.libjpeg_verdict(zeroed) == images.WARNED
    assert _verdict(zeroed, "stream") == _tf_verdict(zeroed)  # a warned file gets Pillow's verdict


def test_stream_check_keeps_the_original_bytes_and_header_size():
    data = _encode(_photo((160, 120)), "JPEG")
    prepared = prepare_image(data, ImageOptions(check="stream"))
    assert prepared.data is data and (prepared.width, prepared.height) == (160, 120)


def test_repaired_jpeg_keeps_the_source_quality_unless_told():
    source = _encode(_photo((400, 300)), "JPEG", quality=70)
    source_tables = Image.open(io.BytesIO(source)).quantization
    kept = prepare_image(source, ImageOptions(max_side=200))
    assert Image.open(io.BytesIO(kept.data)).quantization == source_tables
    at_95 = prepare_image(source, ImageOptions(max_side=200, jpeg_quality=95))
    assert Image.open(io.BytesIO(at_95.data)).quantization != source_tables
    assert len(kept.data) < len(at_95.data)
    # Not a JPEG source: no tables to keep, written at the default quality.
    png = prepare_image(_encode(_photo((400, 300)), "PNG"))
    reference = _encode(_photo((400, 300)), "JPEG", quality=images.DEFAULT_JPEG_QUALITY)
    assert Image.open(io.BytesIO(png.data)).quantization == Image.open(io.BytesIO(reference)).quantization


@pytest.mark.parametrize("kwargs", [{"jpeg_quality": "best"}, {"check": "pixels"}])
def test_quality_and_check_choices_are_validated(kwargs):
    with pytest.raises(UsageError):
        ImageOptions(**kwargs)


@pytest.mark.parametrize("orientation", [1, 6])
def test_big_jpeg_downscaled_through_a_reduced_dct_scale_matches_a_full_decode(orientation):
    photo = _photo((1600, 1200), seed=5)
    exif = Image.Exif()
    exif[0x0112] = orientation
    source = _encode(photo, "JPEG", quality=90, exif=exif.tobytes())
    prepared = prepare_image(source, ImageOptions(max_side=200))
    size = (200, 150) if orientation == 1 else (150, 200)
    assert f"downscaled {1600 if orientation == 1 else 1200}x{1200 if orientation == 1 else 1600} to {size[0]}x{size[1]}" \
        in "; ".join(prepared.actions)
    reference = Image.open(io.BytesIO(source))
    reference.load()
    if orientation != 1:
        reference = reference.transpose(Image.Transpose.ROTATE_270)
    reference = np.asarray(reference.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0), dtype=np.float32)
    ours = _tf_rgb(prepared.data).astype(np.float32)
    assert ours.shape == reference.shape
    assert np.abs(ours - reference).mean() < 3.0  # re-encoding noise; the reduced-scale decode adds about nothing


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height (grey, 8 bits) with one tiny IDAT: its header is all a size
    check reads, so a 30000x30000 picture costs a few dozen bytes."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 16)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def test_a_huge_png_is_refused_by_the_max_pixels_limit_that_applies_not_pillows():
    """Pillow refused it first, quoting its own 178,956,970-pixel limit where --max-pixels (default
    89,478,485) applies."""
    data = _png_header_only(30000, 30000)
    assert len(data) < 200
    with pytest.raises(UnusableImage) as caught:
        prepare_image(data)
    message = str(caught.value)
    assert f"limit {images.DEFAULT_MAX_PIXELS}" in message and "30000x30000" in message, message
    assert "178956970" not in message, message
    with pytest.raises(UnusableImage) as caught:
        prepare_image(data, ImageOptions(max_pixels=1_000_000))
    assert "limit 1000000" in str(caught.value)
