"""Rotary position embedding applied to the flat token stream, q and k in one function.

The rotation pairs dimension i with i + d/2 (the "rotate half" layout of every served family). Both
halves are written from the two input halves directly, so nothing builds `rotate_half`'s negated
concatenation first; `x1·c − x2·s` equals transformers' `x1·c + (−x2)·s` exactly (negation is exact).
"""

from __future__ import annotations

import torch


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, d]; cos, sin [T, d/2] in x's dtype -> x rotated by each token's position."""
    x1, x2 = x.unflatten(-1, (2, -1)).unbind(-2)
    c, s = cos[:, None], sin[:, None]
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-2).flatten(-2)


def half_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' [.., T, d] tables (each the same d/2 frequencies twice) -> [T, d/2] each."""
    half = cos.shape[-1] // 2
    return cos.reshape(-1, cos.shape[-1])[:, :half], sin.reshape(-1, sin.shape[-1])[:, :half]
