"""The dense backend: one SDPA call per sequence with an explicit boolean mask — the portable reference.

It is also where the other backends go for what they do not cover (a sliding window shorter than a
pair, a soft-capped encoder layer), so its metadata is part of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from kafka_scorer.engine.attention.layout import AttentionLayout, host, segment_ids, to_device

if TYPE_CHECKING:  # typing.Self is Python 3.11's; the package supports 3.10, where importing it fails
    from typing_extensions import Self


@dataclass(frozen=True)
class DenseMetadata:
    """The layout and each token's segment: O(T). A sequence's mask is formed from its segments on the
    device when a layer needs it: O(L²) booleans, next to SDPA's O(L²·heads·dim) work on that mask."""

    layout: AttentionLayout
    segments: torch.Tensor
    """[T] int32: 0 for prefix tokens, k+1 for tokens of item k."""
    backend: ClassVar[str] = "dense"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool) -> DenseMetadata:
        parts = [segment_ids(p, items) for p, items in zip(layout.prefix_lens, layout.item_lens)]
        segments = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32)
        return cls(layout, host(segments, pin))

    def to(self, device: torch.device) -> DenseMetadata:
        return to_device(self, device)


@dataclass(frozen=True)
class OverDense:
    """Base of the other backends' metadata: each leaves some layers to the dense path (a sliding
    window shorter than a plain pair; the cascade also a soft-capped encoder layer), so each carries
    the dense metadata, and the layout with it."""

    dense: DenseMetadata

    @property
    def layout(self) -> AttentionLayout:
        return self.dense.layout

    def to(self, device: torch.device) -> Self:
        return to_device(self, device)


def sequence_mask(segments: torch.Tensor, window: int | None = None, causal: bool = True) -> torch.Tensor:
    """Boolean [L, L] mask (True = may attend) of one sequence from its segment ids, on their device:
    SPEC §5 (causal) or §8 (bidirectional). `window` keeps keys less than `window` tokens away."""
    length = segments.numel()
    idx = torch.arange(length, device=segments.device)
    distance = idx[:, None] - idx[None, :]
    if causal:
        allowed = distance >= 0
        allowed &= (segments[None, :] == 0) | (segments[None, :] == segments[:, None])
    else:
        # Every token sees the sequence's segment-0 keys: all of an encoder pair; a late-interaction
        # query's tokens but not its hidden expansion tokens (segment 1, `engine/late_interaction/`).
        allowed = (segments[None, :] == 0).expand(length, length).clone()
        distance = distance.abs()
    if window is not None:
        allowed &= distance < window
    return allowed


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: DenseMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d]; one SDPA call per sequence with its own mask.

    A plain pair within the window needs no mask (SDPA's causal flag, or none for an encoder). The
    window only ever applies to plain pairs: a packed sequence longer than the window is refused at
    preparation. SDPA cannot soft-cap, so a capped layer forms each sequence's scores explicitly.
    """
    layout = metadata.layout
    gqa = q.shape[0] != k.shape[0]
    outputs = []
    for start, length, items in zip(layout.seq_starts, layout.seq_lens, layout.item_lens):
        end = start + length
        windowed = window is not None and (not items or not layout.causal) and length > window
        segments, seq_window = metadata.segments[start:end], window if windowed else None
        if softcap is not None:  # explicit scores, always masked
            allowed = sequence_mask(segments, seq_window, layout.causal)
            out = capped_attention(
                q[None, :, start:end], k[None, :, start:end], v[None, :, start:end], allowed, scale, softcap
            )
            outputs.append(out[0].to(q.dtype))
            continue
        mask = sequence_mask(segments, seq_window, layout.causal) if items or windowed else None
        outputs.append(
            F.scaled_dot_product_attention(
                q[:, start:end],
                k[:, start:end],
                v[:, start:end],
                attn_mask=mask,
                is_causal=mask is None and layout.causal,
                scale=scale,
                enable_gqa=gqa,
            )
        )
    return torch.cat(outputs, dim=1)


def soft_cap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """`cap · tanh(scores / cap)`: Gemma 2's bound on attention scores and final logits."""
    return torch.tanh(scores / cap) * cap


# float32 scores formed at once by the explicit soft-capped path (256 MiB); longer inputs go by query rows.
_SCORES_BUDGET = 1 << 26


def capped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    """Soft-capped masked attention with explicit scores: q [B, H, Lq, d] -> float32 [B, H, Lq, d].

    k/v are [B, Hkv, Lk, d] (GQA by a view, no copy); `mask` (True = may attend) is [Lq, Lk], shared by
    the batch, and applies after the cap, as in Gemma 2.
    """
    batch, heads, q_len, dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    qg = q.view(batch, kv_heads, heads // kv_heads, q_len, dim)
    kt, vg = k[:, :, None].transpose(-1, -2), v[:, :, None]
    out = torch.empty(qg.shape, dtype=torch.float32, device=q.device)
    step = max(1, _SCORES_BUDGET // max(1, batch * heads * k_len))
    for row in range(0, q_len, step):
        rows = slice(row, row + step)
        scores = soft_cap(torch.matmul(qg[..., rows, :], kt).float() * scale, softcap)
        probs = torch.softmax(scores.masked_fill_(~mask[rows], float("-inf")), dim=-1).to(v.dtype)
        out[..., rows, :] = torch.matmul(probs, vg)
    return out.view(batch, heads, q_len, dim)
