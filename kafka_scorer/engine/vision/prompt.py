"""A vision job's pairs as the model reads them: prompt text with image placeholders, and the images.

A query or item is rendered part by part, in the order sent: a text part is its text, an image part
`<|vision_start|><|image_pad|><|vision_end|>` — what Qwen-VL's chat template writes for an image
content item. A pair is the served template's prompt with the query and the item rendered into it
(or, without a template, the query then the item, as the text kinds join them). Each `<|image_pad|>`
then stands for as many tokens as the image processor makes merged patches of its image
(`grid_t · grid_h · grid_w / merge_size²`), the expansion transformers' Qwen-VL processors apply
before tokenizing; it is applied here, image by image, in the order the placeholders appear.

Images are decoded and preprocessed once per job, whatever the number of pairs they appear in (the
query's images are in every pair), on the preparing thread.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafka_scorer.engine.prepare.prepared import InputError
from kafka_scorer.engine.vision.images import ImageLimits, decode_image
from kafka_scorer.wire.content import Content, ImageData, TextPart
from kafka_scorer.wire.protocol import ErrorCode

if TYPE_CHECKING:
    import torch

    from kafka_scorer.engine.vision.checkpoint import VisionModel


@dataclass
class Side:
    """One query or item: its text with one placeholder per image, and those images' indices in the
    job's list of processed images."""

    text: str
    images: list[int] = field(default_factory=list)


@dataclass
class ProcessedImage:
    pixels: torch.Tensor
    """[patches, channels · temporal · patch²]: what the vision tower reads."""
    grid: torch.Tensor
    """[1, 3]: (t, h, w) in patches."""
    tokens: int
    """How many `<|image_pad|>` tokens it becomes in the prompt."""
    key: bytes = b""
    """A hash of the preprocessed patches and grid: the vision-feature cache's key (`features.py`)."""


class ImageBook:
    """The processed images of one job, in the order they were first met, and the limit on their count."""

    def __init__(self, model: VisionModel, limits: ImageLimits) -> None:
        self.model = model
        self.limits = limits
        self.images: list[ProcessedImage] = []

    def add(self, image: ImageData, where: str, item: int | None) -> int:
        if len(self.images) >= self.limits.max_images_per_job:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"{where}: more than max_images_per_job={self.limits.max_images_per_job} images in the job",
                item=item,
            )
        decoded = decode_image(image, self.limits, where, item)
        self.images.append(self._processed(decoded))
        return len(self.images) - 1

    def _processed(self, decoded: Any) -> ProcessedImage:
        out = self.model.image_processor(images=[decoded], return_tensors="pt")
        pixels, grid = out["pixel_values"], out["image_grid_thw"]
        key = hashlib.sha256(pixels.numpy().tobytes() + grid.numpy().tobytes()).digest()
        return ProcessedImage(pixels, grid, int(grid.prod()) // self.model.merge_size**2, key)


def render_side(value: str | Content, book: ImageBook, name: str, item: int | None) -> Side:
    """`name` says where an image sits in an error ("query", "item 3"); `item` is the item's index."""
    if isinstance(value, str):
        _check_text(value, book.model, name, item)
        return Side(value)
    model = book.model
    placeholder = model.vision_start + model.image_token + model.vision_end
    texts: list[str] = []
    side = Side("")
    for part in value.content:
        if isinstance(part, TextPart):
            _check_text(part.text, model, name, item)
            texts.append(part.text)
        else:
            side.images.append(book.add(part.image, f"{name} image {len(side.images)}", item))
            texts.append(placeholder)
    side.text = "".join(texts)
    return side


def _check_text(text: str, model: VisionModel, name: str, item: int | None) -> None:
    """Text that spells a vision token would stand for an image that is not there."""
    for token in (model.image_token, model.vision_start, model.vision_end):
        if token in text:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"{name}: its text contains {token!r}, which stands for an image; send images as image parts",
                item=item,
            )


def expand(prompt: str, images: list[ProcessedImage], image_token: str) -> str:
    """Each placeholder repeated once per token of its image, in order."""
    pieces = prompt.split(image_token)
    assert len(pieces) == len(images) + 1, "one placeholder per image"
    out = [pieces[0]]
    for image, after in zip(images, pieces[1:]):
        out.append(image_token * image.tokens + after)
    return "".join(out)
