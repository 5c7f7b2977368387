"""The attention backends by name, and the function transformers' layers call.

`scorer_attention` is registered in transformers' attention registry under `ATTENTION_IMPLEMENTATION`,
so HF decoder and encoder layers call it with RoPE already applied; it reads the batch's metadata from
the forward's kwargs (`METADATA_KWARG`), never from `input_ids`.

Two things vary per layer, not per batch, so they arrive with each call rather than in the metadata:
logit soft-capping (Gemma 2: `cap · tanh(q·kᵀ·scale / cap)` before the mask) and the sliding window
(Gemma 2 alternates windowed and full layers). Without a cap every backend runs exactly its uncapped
code; with one, the steps that use a fused kernel which cannot cap form their scores explicitly.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from kafka_scorer.engine.attention.aligned_spans import AlignedSpanMetadata, aligned_spans_attention
from kafka_scorer.engine.attention.cached import PrefixedMetadata, prefixed_attention
from kafka_scorer.engine.attention.cascade import CascadeMetadata, cascade_attention, prepare_cascade
from kafka_scorer.engine.attention.dense import DenseMetadata, dense_attention
from kafka_scorer.engine.attention.flex import FlexMetadata, flex_attention
from kafka_scorer.engine.attention.layout import AttentionLayout
from kafka_scorer.engine.attention.pairs import PairMetadata
from kafka_scorer.engine.attention.segmented import SegmentedMetadata, segmented_attention
from kafka_scorer.engine.attention.spans import SpanMetadata, spans_attention
from kafka_scorer.engine.attention.tiled import TiledMetadata, tiled_attention
from kafka_scorer.engine.attention.varlen import VarlenMetadata, varlen_attention

ATTENTION_IMPLEMENTATION = "kafka_scorer"
METADATA_KWARG = "scorer_attention_metadata"

log = logging.getLogger(__name__)

AttentionMetadata = (
    DenseMetadata
    | CascadeMetadata
    | PairMetadata
    | FlexMetadata
    | TiledMetadata
    | SegmentedMetadata
    | SpanMetadata
    | AlignedSpanMetadata
    | VarlenMetadata
)
"""One batch's attention metadata; its `backend` names the registry entry that reads it."""

M = TypeVar("M")


@dataclass(frozen=True)
class Backend(Generic[M]):
    prepare: Callable[[AttentionLayout, bool], M]
    """On the packing thread: the layout -> this backend's metadata as CPU tensors (pinned if asked)."""
    attend: Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, M, float, float | None, int | None], torch.Tensor
    ]
    """On the device: q [H, T, d], k/v [Hkv, T, d], metadata, scale, soft-cap, window -> [H, T, d]."""


BACKENDS: dict[str, Backend[Any]] = {
    "dense": Backend(DenseMetadata.build, dense_attention),
    "cascade": Backend(prepare_cascade, cascade_attention),
    "flex": Backend(FlexMetadata.build, flex_attention),
    # deterministic mode's three (engine/load/deterministic.py): on CUDA the span kernel over aligned spans
    # (the tiles where it cannot run), a call per segment on the CPU
    "deterministic": Backend(TiledMetadata.build, tiled_attention),
    "deterministic-spans": Backend(AlignedSpanMetadata.build, aligned_spans_attention),
    "segmented": Backend(SegmentedMetadata.build, segmented_attention),
    # Opt-in until a GPU has timed it next to flex (`devtools/gpu_check/`); `auto` never picks it.
    "spans": Backend(SpanMetadata.build, spans_attention),
    "varlen": Backend(VarlenMetadata.build, varlen_attention),
}


def prepare_attention(layout: AttentionLayout, backend: str, pin: bool = False) -> AttentionMetadata:
    """The metadata `backend` reads, built now (the packing thread calls this once per forward)."""
    return BACKENDS[backend].prepare(layout, pin)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d] by the backend the metadata was built for."""
    return BACKENDS[metadata.backend].attend(q, k, v, metadata, scale, softcap, window)


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
    metadata = kwargs.get(METADATA_KWARG)
    if not isinstance(metadata, AttentionMetadata | PrefixedMetadata):
        raise RuntimeError(
            f"attention {ATTENTION_IMPLEMENTATION!r} needs the `{METADATA_KWARG}` forward kwarg; "
            "this model's forward does not pass attention kwargs through"
        )
    if kwargs.get("s_aux") is not None:
        # Attention sinks would need their own maths; refusing beats a wrong score.
        raise NotImplementedError("attention with `s_aux` (attention sinks) is not supported")
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    # A layer that names its window (Gemma 2, Qwen 2/3: None on full-attention layers) is believed over
    # the model-wide one, which only serves layers that say nothing.
    window = _setting(kwargs, "sliding_window", metadata.layout.sliding_window)
    softcap = _setting(kwargs, "softcap", None)
    layer = int(getattr(module, "layer_idx", 0))
    out = attend_layer(
        query[0], key[0], value[0], metadata, layer, scale, softcap, None if window is None else int(window)
    )
    return out.transpose(0, 1).unsqueeze(0), None


def _setting(kwargs: dict[str, object], name: str, default: int | None) -> float | None:
    """A layer's numeric attention kwarg (transformers passes `softcap` and `sliding_window` as numbers
    or None), `default` where the layer passes none."""
    value = kwargs.get(name, default)
    if value is None or isinstance(value, int | float):
        return value
    raise TypeError(f"attention kwarg {name!r}: expected a number or None, got {type(value).__name__}")


def attend_layer(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: AttentionMetadata | PrefixedMetadata,
    layer: int,
    scale: float,
    softcap: float | None,
    window: int | None,
) -> torch.Tensor:
    """One decoder layer's attention, q [H, T, d], k/v [Hkv, T, d] -> [H, T, d]: the entry both the
    transformers layers (through `scorer_attention`) and the engine's own layers (`engine/models/`) call."""
    cap, window = float(softcap) if softcap else None, int(window) if window else None
    if isinstance(metadata, PrefixedMetadata):
        # A batch with cached prefixes (engine/pack/prefix_cache.py): the layer picks the prefix's states.
        return prefixed_attention(q, k, v, metadata, layer, attend, scale, cap, window)
    return attend(q, k, v, metadata, scale, cap, window)


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, scorer_attention)


def choose_attention_backend(device: torch.device) -> str:
    """FlexAttention's fused kernel needs CUDA and a working compiler; prove both once, else cascade."""
    if device.type != "cuda":
        return "cascade"
    try:
        q = torch.randn(2, 160, 64, device=device, dtype=torch.bfloat16)
        metadata = FlexMetadata.build(AttentionLayout([0], [160], [32], [(64, 64)]), pin=True).to(device)
        flex_attention(q, q[:1], q[:1], metadata, 0.125)
        torch.cuda.synchronize(device)
    except Exception as exc:  # compiler missing, old GPU, ...: the portable path still serves
        log.warning("FlexAttention unavailable on %s (%s); using the cascade attention backend", device, exc)
        return "cascade"
    return "flex"
