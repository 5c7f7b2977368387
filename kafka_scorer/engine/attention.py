"""Attention over a packed batch: plain causal pairs and MIS sequences, several jobs per forward.

The batch is one flat token stream. `AttentionLayout` (built on the CPU by `engine/batch.py`, once per
batch) says where each sequence starts, how long its shared prefix (the query) is and how long each
item after it is. Rule (SPEC §5): a prefix token sees the prefix causally; an item token sees the whole
prefix and the earlier tokens of its own item. A plain pair is a sequence with no items.

The function is registered in transformers' attention registry, so HF decoder layers call it with
RoPE already applied; it reads the layout from the forward's kwargs, never from `input_ids`.

Backends, chosen per batch:
- `dense`: SDPA per sequence with an explicit boolean mask — the portable reference.
- `cascade`: cost follows the mask. Prefix causal attention once per sequence; every item attends to
  the prefix in one rectangular product and to itself in a small causal block; the two partial
  results merge by log-sum-exp. Work is about n·I·(Q+I) instead of (Q+n·I)².
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTENTION_IMPLEMENTATION = "kafka_scorer"
LAYOUT_KWARG = "scorer_layout"

Backend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "AttentionLayout", float], torch.Tensor]


@dataclass
class AttentionLayout:
    """Per-batch attention metadata: CPU lists from tokenization plus device tensors built once."""

    seq_starts: list[int]
    seq_lens: list[int]
    prefix_lens: list[int]
    item_lens: list[tuple[int, ...]]
    device: torch.device
    backend: str = "dense"
    sliding_window: int | None = None
    _cache: dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    def cached(self, key: str, build: Callable[[], object]) -> object:
        """Masks and index tensors are built on the first layer and reused by all the others."""
        value = self._cache.get(key)
        if value is None:
            value = build()
            self._cache[key] = value
        return value


def segment_ids(prefix_len: int, item_lens: tuple[int, ...]) -> torch.Tensor:
    """0 for prefix tokens, k+1 for tokens of item k (CPU)."""
    parts = [torch.zeros(prefix_len, dtype=torch.int32)]
    parts += [torch.full((n,), k + 1, dtype=torch.int32) for k, n in enumerate(item_lens)]
    return torch.cat(parts)


def sequence_mask(prefix_len: int, item_lens: tuple[int, ...], window: int | None = None) -> torch.Tensor:
    """Boolean [L, L] mask (True = may attend) of one sequence, SPEC §5."""
    seg = segment_ids(prefix_len, item_lens)
    length = seg.numel()
    idx = torch.arange(length)
    allowed = idx[None, :] <= idx[:, None]
    allowed &= (seg[None, :] == 0) | (seg[None, :] == seg[:, None])
    if window is not None and not item_lens:
        allowed &= (idx[:, None] - idx[None, :]) < window
    return allowed


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, scale: float
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d]; one SDPA call per sequence with its own mask."""

    def build_masks() -> list[torch.Tensor | None]:
        masks: list[torch.Tensor | None] = []
        for prefix, items, length in zip(layout.prefix_lens, layout.item_lens, layout.seq_lens):
            plain = not items and (layout.sliding_window is None or length <= layout.sliding_window)
            if plain:
                masks.append(None)
            else:
                masks.append(sequence_mask(prefix, items, layout.sliding_window).to(layout.device))
        return masks

    masks = layout.cached("dense_masks", build_masks)
    gqa = q.shape[0] != k.shape[0]
    outputs = []
    for start, length, mask in zip(layout.seq_starts, layout.seq_lens, masks):
        end = start + length
        outputs.append(
            F.scaled_dot_product_attention(
                q[:, start:end],
                k[:, start:end],
                v[:, start:end],
                attn_mask=mask,
                is_causal=mask is None,
                scale=scale,
                enable_gqa=gqa,
            )
        )
    return torch.cat(outputs, dim=1)


BACKENDS: dict[str, Backend] = {"dense": dense_attention}


def scorer_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention-registry entry point: [1, H, T, d] in, [1, T, H, d] out."""
    layout = kwargs.get(LAYOUT_KWARG)
    if not isinstance(layout, AttentionLayout):
        raise RuntimeError(
            f"attention {ATTENTION_IMPLEMENTATION!r} needs the `{LAYOUT_KWARG}` forward kwarg; "
            "this model's forward does not pass attention kwargs through"
        )
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    out = BACKENDS[layout.backend](query[0], key[0], value[0], layout, scale)
    return out.transpose(0, 1).unsqueeze(0), None


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, scorer_attention)
