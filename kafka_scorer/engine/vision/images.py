"""Image bytes -> a decoded image, or the one-line reason this job's image cannot be used.

Every image of a job is checked on the CPU while the job is prepared, before it can reach a batch, so
a bad image is an error `Result` for its own job and nothing else (SPEC §11). The order of the checks
is the order of their cost: the byte count, the format from the first bytes (no decoder runs on
bytes of an unknown format), the declared media type against it, the pixel count from the header
(a decompression bomb's header is honest about its size: it is refused before a pixel is decoded),
then the full decode, which finds truncated and corrupt data.

Pillow decodes; only the formats in `FORMATS` are opened (`Image.open(formats=...)`), so none of
Pillow's rarer decoders sees hostile bytes. Pillow's own process-wide switches (`MAX_IMAGE_PIXELS`,
`LOAD_TRUNCATED_IMAGES`) are left at their defaults: the pixel limit here is the worker's setting,
checked before Pillow's, and a truncated image is an error, never a partly grey picture.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_scorer.engine.prepare.prepared import InputError
from kafka_scorer.wire.content import ImageData
from kafka_scorer.wire.protocol import ErrorCode

if TYPE_CHECKING:
    from PIL.Image import Image

FORMATS = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
    "BMP": "image/bmp",
}
"""Pillow's format name -> its media type: the formats a job's image may be in."""

_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
)


@dataclass(frozen=True)
class ImageLimits:
    """The worker's image settings (docs/configuration.md), each over-limit case `invalid_request`."""

    max_images_per_job: int = 32
    max_image_bytes: int = 10 * 2**20
    max_image_pixels: int = 7680 * 4320
    """An 8K frame: larger photos are refused before decoding; the model's processor scales every
    accepted image to its own pixel range afterwards."""


def sniffed_format(data: bytes) -> str | None:
    """The format the first bytes announce (Pillow's name), or None for none of `FORMATS`."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in _MAGIC if data.startswith(magic)), None)


def decode_image(image: ImageData, limits: ImageLimits, where: str, item: int | None = None) -> Image:
    """The decoded image, or `InputError(invalid_request)` naming `where` ("query image 0", ...)."""

    def refuse(why: str) -> InputError:
        return InputError(ErrorCode.INVALID_REQUEST, f"{where}: {why}", item=item)

    data = image.data
    if len(data) > limits.max_image_bytes:
        raise refuse(f"{len(data)} bytes; the limit is max_image_bytes={limits.max_image_bytes}")
    kind = sniffed_format(data)
    if kind is None:
        known = ", ".join(FORMATS)
        raise refuse(f"not an image in a known format ({known}): its first bytes are {data[:8]!r}")
    declared = _ALIASES.get(image.declared or "", image.declared)
    if declared is not None and declared != FORMATS[kind]:
        raise refuse(f"declared {image.declared!r} but the bytes are {FORMATS[kind]}")
    return _opened(data, kind, limits, refuse)


def _opened(data: bytes, kind: str, limits: ImageLimits, refuse) -> Image:
    from PIL import Image as PILImage

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            opened = PILImage.open(io.BytesIO(data), formats=[kind])
            width, height = opened.size
            if width < 1 or height < 1 or width * height > limits.max_image_pixels:
                raise refuse(
                    f"{width}x{height} = {width * height} pixels; the limit is "
                    f"max_image_pixels={limits.max_image_pixels} (a decompression bomb is refused here)"
                )
            opened.load()
    except InputError:
        raise
    except PILImage.DecompressionBombError as exc:  # over Pillow's own bound, checked at open
        bound = f"max_image_pixels={limits.max_image_pixels}"
        raise refuse(f"a decompression bomb ({exc}); the limit is {bound}") from None
    except Exception as exc:  # hostile bytes raise many types from the decoders: each is a bad image
        raise refuse(f"corrupt or truncated {kind} ({type(exc).__name__}: {exc})") from None
    return opened
