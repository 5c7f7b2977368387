"""Content parts: a query, item or document that is an image, or text with images (SPEC §11).

The shape follows what multimodal rerank servers already accept, so a pipeline moves over without
re-shaping its requests:
- `{"content": [part, ...]}` wraps the parts of one input, as vLLM's rerank and score APIs wrap a
  multimodal query or document (its `ScoreMultiModalParam`), and as a chat message holds its parts;
- a part is tagged by `type`, the discriminator vLLM and OpenAI-style content parts share;
  `{"type": "text", "text": ...}` is the same in all of them;
- an image part is `{"type": "image", "image": ...}`: the key Jina's multimodal rerank API uses for a
  document's image (`{"image": <base64>}`) and the part Qwen-VL's own message format uses. vLLM's
  `{"type": "image_url", "image_url": {"url": ...}}` was not taken: the worker fetches no URLs (a
  reranker that downloads whatever a record names is a server-side request forgery waiting to
  happen), and a field called `url` would promise that it does.

The image itself is bytes: base64 or a `data:<media type>;base64,` URI in JSON, raw bytes (a `bin`)
in MessagePack, so a MessagePack job carries no base64 inflation. `ImageData` is a msgspec custom
type so that one field takes both; the codecs here are passed to every decoder and encoder of a Job.
Whether the bytes are a usable image is the preparer's question (`engine/vision/images.py`), answered
per job: the wire only refuses what is not bytes at all.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

import msgspec

_DATA_URI = re.compile(r"^data:(?P<media>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*);base64,", re.I)
_URL_SCHEMES = ("http://", "https://", "file://", "ftp://", "s3://", "gs://")


class ImageData:
    """An image's bytes as sent, and the media type its data URI declared (None: plain base64/bytes)."""

    __slots__ = ("data", "declared")

    def __init__(self, data: bytes, declared: str | None = None) -> None:
        self.data = bytes(data)
        self.declared = declared

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageData) and (self.data, self.declared) == (other.data, other.declared)

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"ImageData({len(self.data)} bytes, declared={self.declared!r})"


class TextPart(msgspec.Struct, tag="text", tag_field="type", frozen=True, forbid_unknown_fields=True):
    text: str


class ImagePart(msgspec.Struct, tag="image", tag_field="type", frozen=True, forbid_unknown_fields=True):
    image: ImageData


ContentPart = TextPart | ImagePart


class Content(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One query, item or document made of parts, in order (text before an image reads before it)."""

    content: list[ContentPart]

    @property
    def images(self) -> list[ImageData]:
        return [part.image for part in self.content if isinstance(part, ImagePart)]


def image_from_wire(value: object) -> ImageData:
    """An `image` field's value as decoded: a str (JSON: base64 or a data URI) or bytes (MessagePack)."""
    if isinstance(value, ImageData):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return ImageData(bytes(value))
    if not isinstance(value, str):
        got = type(value).__name__
        raise TypeError(f"expected image bytes (base64 text or a data URI in JSON), got {got}")
    if value.lower().startswith(_URL_SCHEMES):
        raise ValueError("image URLs are not fetched; send the image's bytes (base64 or a data: URI)")
    declared, payload = None, value
    match = _DATA_URI.match(value)
    if match is not None:
        declared, payload = (match["media"] or "").lower() or None, value[match.end() :]
    elif value.lower().startswith("data:"):
        raise ValueError("a data: URI's image must be base64 (`data:image/png;base64,...`)")
    try:
        return ImageData(base64.b64decode(payload, validate=True), declared)
    except (binascii.Error, ValueError):
        raise ValueError("image is not valid base64 (nor a data: URI)") from None


def dec_hook(kind: type, value: Any) -> Any:
    """msgspec's hook for the wire's custom type: an `image` field's value -> `ImageData`."""
    if kind is ImageData:
        return image_from_wire(value)
    raise TypeError(f"no decoder for {kind!r}")


def enc_hook(value: Any) -> Any:
    """`ImageData` -> bytes: base64 in JSON (msgspec's rule for bytes), a `bin` in MessagePack."""
    if isinstance(value, ImageData):
        return value.data
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


def schema_hook(kind: type) -> dict[str, Any]:
    """The JSON Schema of an `image` value, as it reads in JSON (MessagePack sends the raw bytes)."""
    if kind is ImageData:
        return {
            "type": "string",
            "description": "The image's bytes: base64, or a data URI (`data:image/png;base64,...`); "
            "raw bytes in MessagePack. URLs are not fetched.",
        }
    raise NotImplementedError(f"no schema for {kind!r}")


def content_document(document: dict[str, Any]) -> Content | None:
    """A rerank-shape document object that carries `content` parts, as `Content` (None: it has none).

    Documents are free-form objects on the wire (their `rank_fields` may name any field), so a
    document's parts are typed here, with the same rules as a query's; `ValueError` says what is wrong.
    """
    if "content" not in document:
        return None
    try:
        return msgspec.convert({"content": document["content"]}, Content, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None


def has_content(value: object) -> bool:
    """Whether a query, item or document is made of content parts."""
    return isinstance(value, Content) or (isinstance(value, dict) and "content" in value)
