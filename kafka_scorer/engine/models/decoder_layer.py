"""One pre-norm decoder layer of the served families, as two dense regions around the attention call.

`before_attention`: (residual add +) input RMSNorm, one q/k/v matmul, Qwen 3's per-head q/k norms,
RoPE on q and k. `after_attention` (Llama, Qwen 2/3, Mistral): o-projection, residual add +
post-attention RMSNorm, one gate/up matmul, the gated activation, the down projection; its output and
the residual go to the next layer unsummed, so the next input norm adds them in the same kernel.
Gemma 2's sandwich norms (`after_attention_sandwich`) normalise each sub-layer's output before its
residual add, so its stream is summed inside the layer. The attention between the regions is the
batch's backend (`engine/attention/registry.attend_layer`), so MIS, pairs, prefix-cache hits, Gemma 2's
soft-capping and its sliding windows are exactly what the transformers layers get.

The regions are plain functions of tensors and constants, so one `torch.compile` of each serves every
layer (weights are arguments, not guarded attributes) and any token count (`dynamic=True`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kafka_scorer.engine.attention.registry import attend_layer
from kafka_scorer.engine.layers.activation import gated
from kafka_scorer.engine.layers.invariant import fixed_linear
from kafka_scorer.engine.layers.norm import add_rms_norm, rms_norm
from kafka_scorer.engine.layers.rotary import rotate


@dataclass(frozen=True)
class LayerShape:
    """What is the same in every layer of a model: head counts, norm flavour, activation."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    offset_norm: bool
    """Gemma's `(1 + weight)` RMSNorm in float32."""
    sandwich: bool
    """Gemma 2's post-attention and pre/post-feedforward norms."""
    activation: str
    fixed_rows: bool = False
    """Deterministic mode: every projection by fixed-shape row blocks (`layers/invariant.py`)."""


def project(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, shape: LayerShape
) -> torch.Tensor:
    """A layer's matmul: the plain one, or in deterministic mode one every row gets alike."""
    return fixed_linear(x, weight, bias) if shape.fixed_rows else F.linear(x, weight, bias)


@dataclass
class LayerWeights:
    """One layer's tensors (views of the checkpoint's, q/k/v and gate/up merged) and its attention."""

    index: int
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor
    post_attention_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    pre_ff_norm: torch.Tensor | None
    post_ff_norm: torch.Tensor | None
    scale: float
    softcap: float | None
    window: int | None
    names_window: bool
    """Whether the checkpoint's layer names its window (None on a full layer) or leaves it to the model."""


def before_attention(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    w: LayerWeights,
    shape: LayerShape,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """[T, D] stream -> q [H, T, d], k, v [Hkv, T, d] (rotated) and the summed residual."""
    normed, residual = add_rms_norm(hidden, residual, w.input_norm, shape.eps, shape.offset_norm)
    qkv = project(normed, w.qkv, w.qkv_bias, shape)
    q_size, kv_size = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k, v = (t.unflatten(-1, (-1, shape.head_dim)) for t in (q, k, v))
    if w.q_norm is not None and w.k_norm is not None:
        q = rms_norm(q, w.q_norm, shape.eps, shape.offset_norm)
        k = rms_norm(k, w.k_norm, shape.eps, shape.offset_norm)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    # Token-major storage, as transformers hands its attention: v is otherwise a strided slice of the
    # merged q/k/v output, which the compiled FlexAttention kernel reads more slowly.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), residual


def after_attention(
    attended: torch.Tensor, residual: torch.Tensor, w: LayerWeights, shape: LayerShape
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output [H, T, d] -> (MLP output, residual), left unsummed for the next input norm."""
    out = project(attended.transpose(0, 1).flatten(1), w.o_proj, None, shape)
    normed, residual = add_rms_norm(out, residual, w.post_attention_norm, shape.eps, shape.offset_norm)
    return project(
        gated(project(normed, w.gate_up, None, shape), shape.activation), w.down, None, shape
    ), residual


def after_attention_sandwich(
    attended: torch.Tensor, residual: torch.Tensor, w: LayerWeights, shape: LayerShape
) -> tuple[torch.Tensor, None]:
    """Gemma 2: each sub-layer's output normalised before its residual add; returns the summed stream."""
    assert w.pre_ff_norm is not None and w.post_ff_norm is not None
    eps, offset = shape.eps, shape.offset_norm
    out = project(attended.transpose(0, 1).flatten(1), w.o_proj, None, shape)
    stream = residual + rms_norm(out, w.post_attention_norm, eps, offset)
    gate_up = project(rms_norm(stream, w.pre_ff_norm, eps, offset), w.gate_up, None, shape)
    mlp = project(gated(gate_up, shape.activation), w.down, None, shape)
    return stream + rms_norm(mlp, w.post_ff_norm, eps, offset), None


@dataclass(frozen=True)
class Regions:
    """The two dense regions a layer runs, eager or compiled (`decoder.compile_regions`)."""

    before: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    after: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    compiled: bool = False
    """Whether the regions are `torch.compile`d: their first call compiles, and the warm-up runs them
    eagerly instead when that fails (`engine/load/warm_up_fallbacks.py`)."""

    @classmethod
    def eager(cls, shape: LayerShape) -> Regions:
        """The plain functions for a layer of this shape (Gemma 2's sandwich norms, or not)."""
        return cls(before_attention, after_attention_sandwich if shape.sandwich else after_attention)


def run_layer(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    w: LayerWeights,
    shape: LayerShape,
    tables: tuple[torch.Tensor, torch.Tensor],
    metadata: object,
    regions: Regions,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One layer: dense region, the batch's attention, dense region."""
    q, k, v, residual = regions.before(hidden, residual, w, shape, *tables)
    window = w.window if w.names_window else metadata.layout.sliding_window  # type: ignore[attr-defined]  # metadata is every backend's own type; each has .layout
    attended = attend_layer(q, k, v, metadata, w.index, w.scale, w.softcap, window)  # type: ignore[arg-type]  # as above: attend_layer dispatches on the metadata's backend
    return regions.after(attended, residual, w, shape)
