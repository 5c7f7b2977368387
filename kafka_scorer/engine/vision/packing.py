"""Multi-item scoring with images: the query once, every item after it as if it alone followed it.

A job's pairs are tokenized whole (`preparer.py`), so the seam between the shared prompt head and an
item is wherever the pairs stop agreeing, exactly as the tokenizer cut them; the shared prefix is the
longest run of tokens every pair starts with, cut before the first image token that belongs to an
item (two items may both start with an image of the same size: equal token ids, different pixels)
and before each pair's last token (every item keeps a scoring token of its own).

Positions are the model's own: each pair's 3-D M-RoPE positions (`get_rope_index`, the function
transformers' forward calls) are computed for the pair alone, and the packed sequence takes the
prefix's from any pair and each item's from its own pair. The attention mask (`forward.py`) lets an
item's tokens see the prefix and themselves only; image features are per token, and the images of a
packed sequence are in token order (the query's, then each item's). So every item's hidden states
are those of its pair scored alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from kafka_scorer.engine.vision.checkpoint import VisionModel


def shared_prefix(pairs: list[list[int]], image_token_id: int, query_image_tokens: int) -> int:
    """Length of the prefix every pair starts with, holding none of an item's image tokens."""
    shortest = min(len(ids) for ids in pairs)
    length = 0
    while length < shortest - 1 and all(ids[length] == pairs[0][length] for ids in pairs):
        length += 1
    seen = 0
    for index, token in enumerate(pairs[0][:length]):
        if token == image_token_id:
            seen += 1
            if seen > query_image_tokens:
                length = index
                break
    while 0 < length < len(pairs[0]) and pairs[0][length] == image_token_id == pairs[0][length - 1]:
        length -= 1  # never inside an image's run of tokens: the image goes with the items then
    return length


def rope_positions(model: VisionModel, ids: list[int], grids: torch.Tensor | None) -> torch.Tensor:
    """[3, len(ids)]: the pair's M-RoPE positions as the model computes them for it alone."""
    if grids is None:  # text only: every axis counts tokens
        return torch.arange(len(ids)).expand(3, -1).clone()
    input_ids = torch.tensor([ids])
    options: dict[str, torch.Tensor] = {}
    if model.marks_image_tokens:  # newer transformers read the image tokens from a type mask
        options["mm_token_type_ids"] = (input_ids == model.image_token_id).int()
    body: Any = model.body  # transformers' Qwen3VLModel
    positions, _ = body.get_rope_index(
        input_ids=input_ids, image_grid_thw=grids, attention_mask=torch.ones_like(input_ids), **options
    )
    return positions[:, 0, :]
