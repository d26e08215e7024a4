"""A messy `{split}/{label}/*` tree holding one of every kind of input the converter must handle."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def jpeg_bytes(rng: np.random.Generator, size: tuple[int, int] = (80, 60), quality: int = 85) -> bytes:
    """A small photo-like JPEG (gradient plus noise). tests/conftest.py has the same generator, but with
    --import-mode=importlib a conftest is not importable by name, so the few lines live here too."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    pixels = rng.uniform(0, 255, 3) + x[..., None] * rng.uniform(-2, 2, 3) + y[..., None] * rng.uniform(-2, 2, 3)
    pixels = pixels + rng.normal(0, 12, (height, width, 3))
    return _pil_bytes(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)), "JPEG", quality=quality)


def _pil_bytes(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _photo(rng, size=(80, 60)) -> Image.Image:
    return Image.open(io.BytesIO(jpeg_bytes(rng, size))).convert("RGB")


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height: a decompression bomb that costs nothing to write."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def make_messy_tree(root: Path, seed: int = 0) -> dict[str, object]:
    """Writes the tree and returns what the manifest must say: {relative name: reason or 'ok' or 'repaired'}."""
    rng = np.random.default_rng(seed)
    expect: dict[bytes, str] = {}

    def put(rel: str | bytes, data: bytes, outcome: str) -> None:
        rel_b = rel if isinstance(rel, bytes) else rel.encode()
        path = os.path.join(os.fsencode(root), rel_b)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
        expect[rel_b] = outcome

    for split, per in (("train", 4), ("validation", 2)):
        for label in ("cat", "dog"):
            for i in range(per):
                put(f"{split}/{label}/img_{i}.jpg", jpeg_bytes(rng), "ok")
    photo = _photo(rng)
    put("train/cat/a photo é.jpg", jpeg_bytes(rng), "ok")
    put(b"train/cat/latin1_\xe9\xff.jpg", jpeg_bytes(rng), "ok")
    put("train/cat/png_named.jpg", _pil_bytes(photo, "PNG"), "repaired")
    put("train/cat/gray.jpg", _pil_bytes(photo.convert("L"), "JPEG"), "repaired")
    put("train/cat/cmyk.jpg", _pil_bytes(photo.convert("CMYK"), "JPEG"), "repaired")
    exif = Image.Exif()
    exif[0x0112] = 6
    put("train/cat/rotated.jpg", _pil_bytes(photo, "JPEG", exif=exif.tobytes()), "repaired")
    rgba = photo.convert("RGBA")
    rgba.putalpha(128)
    put("train/cat/alpha.png", _pil_bytes(rgba, "PNG"), "repaired")
    put("train/dog/anim.gif", _pil_bytes(photo.convert("P"), "GIF", save_all=True, append_images=[photo.rotate(90).convert("P")]), "repaired")
    put("train/dog/pic.bmp", _pil_bytes(photo, "BMP"), "repaired")
    put("train/dog/pic.webp", _pil_bytes(photo, "WEBP"), "repaired")
    put("train/dog/pic.tiff", _pil_bytes(photo, "TIFF"), "repaired")
    put("train/dog/big.jpg", jpeg_bytes(rng, (400, 300)), "repaired")  # over max_side=200 in the tests
    put("train/dog/empty.jpg", b"", "empty file")
    good = jpeg_bytes(rng)
    put("train/dog/truncated.jpg", good[: len(good) // 2], "truncated or corrupt image")
    put("train/dog/notes.jpg", b"these are not pixels\n", "not an image")
    put(b"train/dog/odd_\xff.jpg", b"GIF89a but nothing more", "truncated or corrupt image")
    put("train/dog/bomb.png", png_header_only(30000, 30000), "too large to decode")
    put("train/dog/.DS_Store", b"\x00\x00\x00\x01Bud1", "hidden file")
    put("train/dog/.hidden/inner.jpg", jpeg_bytes(rng), "hidden file")
    put("train/stray.jpg", jpeg_bytes(rng), "not inside a class folder")
    put("README.txt", b"about this data\n", "not inside a class folder")
    dangling = os.path.join(os.fsencode(root), b"train/cat/dangling.jpg")
    os.symlink(b"/nonexistent/target.jpg", dangling)
    expect[b"train/cat/dangling.jpg"] = "dangling link"
    return {"root": Path(root), "expect": expect}


@pytest.fixture
def messy_tree(tmp_path):
    return make_messy_tree(tmp_path / "messy")


@pytest.fixture
def jpeg_factory():
    """`jpeg_factory(size=(80, 60))`: a fresh photo-like JPEG each call."""
    rng = np.random.default_rng(1)
    return lambda size=(80, 60): jpeg_bytes(rng, size)
