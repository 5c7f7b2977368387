"""A vision job's pairs laid out for the device: each pair whole, or the query once and every item
after it (MIS, `packing.py`), with each item's images, grids and M-RoPE positions.

`VisionJob` keeps, per item, what its piece of a forward needs, so a job cut between items by the
token budget (`plan_forwards`) carries its own images and positions into every piece; a packed job's
prefix (its ids, images and positions) is repeated in each piece, as the text kinds repeat a query.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import torch

from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.engine.vision.packing import rope_positions, shared_prefix
from kafka_scorer.engine.vision.prompt import ProcessedImage

if TYPE_CHECKING:
    from kafka_scorer.engine.vision.checkpoint import VisionModel


@dataclass
class Images:
    """Some images in token order: their patches `[n, dim]` and grids `[images, 3]` (None: no image)
    and their cache keys."""

    pixels: torch.Tensor | None = None
    grids: torch.Tensor | None = None
    found: list[ProcessedImage] = field(default_factory=list)

    @staticmethod
    def of(images: list[ProcessedImage]) -> Images:
        if not images:
            return Images()
        return Images(torch.cat([i.pixels for i in images]), torch.cat([i.grid for i in images]), images)


@dataclass
class VisionJob(PreparedJob):
    """`items[i]` is item i's token ids (the whole pair, or its tail after the shared `query` prefix when
    `packed`), `images[i]` and `positions[i]` ([3, len]) theirs; `query_images`/`query_positions` the
    prefix's (packed jobs only)."""

    images: list[Images] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)
    query_images: Images = field(default_factory=Images)
    query_positions: torch.Tensor | None = None

    def piece(self, start: int, end: int, num_tokens: int) -> VisionJob:
        cut = cast(VisionJob, super().piece(start, end, num_tokens))
        return replace(cut, images=self.images[start:end], positions=self.positions[start:end])


Pair = tuple[list[int], list[ProcessedImage]]
"""A pair's token ids and its images in token order."""


def as_pairs(model: VisionModel, pairs: list[Pair]) -> dict:
    """The VisionJob fields of a job scored pair by pair."""
    images = [Images.of(found) for _, found in pairs]
    return {
        "query": [],
        "items": [ids for ids, _ in pairs],
        "packed": False,
        "images": images,
        "positions": [rope_positions(model, ids, i.grids) for (ids, _), i in zip(pairs, images)],
    }


def as_packed(model: VisionModel, pairs: list[Pair], query_images: list[ProcessedImage]) -> dict:
    """The VisionJob fields of a job packed behind its shared prefix."""
    query_tokens = sum(image.tokens for image in query_images)
    cut = shared_prefix([ids for ids, _ in pairs], model.image_token_id, query_tokens)
    prefix = pairs[0][0][:cut]
    prefix_images = sum(1 for token in prefix if token == model.image_token_id)
    shared = _images_before(query_images, prefix_images)
    positions = [rope_positions(model, ids, Images.of(found).grids) for ids, found in pairs]
    return {
        "query": prefix,
        "items": [ids[cut:] for ids, _ in pairs],
        "packed": True,
        "images": [Images.of(found[len(shared) :]) for _, found in pairs],
        "positions": [p[:, cut:] for p in positions],
        "query_images": Images.of(shared),
        "query_positions": positions[0][:, :cut],
    }


def _images_before(query_images: list[ProcessedImage], tokens: int) -> list[ProcessedImage]:
    """The query's images whose tokens all lie in the prefix (the cut never splits one)."""
    out, seen = [], 0
    for image in query_images:
        if seen + image.tokens > tokens:
            break
        out.append(image)
        seen += image.tokens
    return out
