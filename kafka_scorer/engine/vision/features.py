"""The vision tower's output per image, computed once for all of a forward's images and cached.

An image's features (the merger's tokens and the deepstack features the first decoder layers add at
its positions) depend on its preprocessed patches alone: the tower attends within each image. So a
document image seen again (the same bytes, preprocessed alike) reuses them: an entry is keyed by the
hash of the patches and the grid (`prompt.py`), under the model's revision and dtype, in the
late-interaction kind's bounded LRU cache (`embedding_cache_mb`, its hit counters on /metrics).
Misses of one forward go through the tower together.

The rest is what transformers' Qwen3-VL forward does with features: token embeddings, image
features scattered into the image tokens in order, the deepstack features handed to the decoder with
the image positions. It is done here, around the model's own `get_image_features` and
`language_model`, because only transformers' later 5.x releases take precomputed features.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from kafka_scorer.engine.pack.embedding_cache import EmbeddingCache
    from kafka_scorer.engine.vision.checkpoint import VisionModel
    from kafka_scorer.engine.vision.prompt import ProcessedImage


def image_features(
    model: VisionModel, images: list[ProcessedImage], cache: EmbeddingCache | None
) -> list[torch.Tensor]:
    """Per image `[1 + deepstack layers, tokens, hidden]` on the device (no deepstack layers for
    Qwen2-VL), from the cache or the tower."""
    found: list[torch.Tensor | None] = [cache.get(i.key) if cache else None for i in images]
    missing = [index for index, hit in enumerate(found) if hit is None]
    if missing:
        computed = _tower(model, [images[index] for index in missing])
        for index, features in zip(missing, computed):
            found[index] = features
            if cache is not None:
                cache.put(images[index].key, features)
    return [features for features in found if features is not None]


def _tower(model: VisionModel, images: list[ProcessedImage]) -> list[torch.Tensor]:
    body: Any = model.body
    pixels = torch.cat([i.pixels for i in images]).to(model.device, model.dtype)
    grids = torch.cat([i.grid for i in images]).to(model.device)
    out = body.get_image_features(pixels, grids, return_dict=True)
    sizes = [i.tokens for i in images]
    deepstack = getattr(out, "deepstack_features", None) or []  # Qwen3-VL's; Qwen2-VL has none
    layers = [list(out.pooler_output)] + [_per_image(feature, sizes) for feature in deepstack]
    return [torch.stack([layer[index] for layer in layers]).contiguous() for index in range(len(images))]


def _per_image(feature: Any, sizes: list[int]) -> list[torch.Tensor]:
    """One deepstack layer's features split per image (a tensor of all, or already a list of each)."""
    if isinstance(feature, torch.Tensor):
        return list(torch.split(feature, sizes))
    return list(feature)


def decoder_hidden(
    model: VisionModel, inputs: dict[str, torch.Tensor], features: list[torch.Tensor]
) -> torch.Tensor:
    """[rows, tokens, hidden] final-norm states: transformers' Qwen3-VL forward, given the features."""
    body: Any = model.body
    input_ids = inputs["input_ids"]
    embeds = body.get_input_embeddings()(input_ids)
    visual: dict[str, Any] = {}
    if features:
        stacked = torch.cat(features, dim=1).to(embeds.dtype)  # [1 + layers, image tokens, hidden]
        where = input_ids == model.image_token_id
        embeds = embeds.masked_scatter(where[..., None], stacked[0])
        if stacked.shape[0] > 1:
            visual = {"visual_pos_masks": where, "deepstack_visual_embeds": list(stacked[1:])}
    out = body.language_model(
        input_ids=None,
        inputs_embeds=embeds,
        position_ids=inputs["position_ids"],
        attention_mask=inputs["attention_mask"],
        use_cache=False,
        **visual,
    )
    return out.last_hidden_state
