"""RMSNorm, alone and fused with the residual add that precedes it in every pre-norm decoder layer.

Two flavours, both reproduced to the operation so eager results equal transformers' bit for bit:
Llama / Qwen normalise in float32, cast back, then scale by the weight in the model dtype; Gemma 2
scales by `1 + weight` in float32 and casts last. The float32 copy lives only inside the op: under
`torch.compile` (the CUDA path) the norm, its cast and the residual add become one kernel that reads
the activation once.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension; `offset` is Gemma's `(1 + weight)` scaling in float32."""
    wide = x.float()
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (normed * (1.0 + weight.float())).to(x.dtype)
    return weight * normed.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, offset: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual): the sum is the next residual, added in the model dtype as
    transformers adds it; the first layer has no residual yet."""
    summed = x if residual is None else residual + x
    return rms_norm(summed, weight, eps, offset), summed
