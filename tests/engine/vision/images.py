"""Test images made with Pillow and numpy: valid ones of each format, and hostile byte strings."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def picture(width: int = 40, height: int = 30, seed: int = 0, fmt: str = "PNG") -> bytes:
    """A random RGB picture encoded as `fmt`."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims `width` x `height` and whose data is a few compressed bytes: what a
    decompression bomb's header looks like before anything is decoded."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = chunk(b"IDAT", zlib.compress(b"\0" * 64))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + pixels + chunk(b"IEND", b"")
