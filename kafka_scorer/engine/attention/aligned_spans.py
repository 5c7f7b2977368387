"""Deterministic mode's attention on CUDA: the span kernel, each token's keys in chunks of its own run.

The tiles (`tiled.py`) make a token's attention independent of its batch-mates with batched torch
calls: on CUDA that is hundreds of launches per layer (a call per 64 tiles and per key step, several
kernels each). The span kernel (`kernels/span_attention_triton.py`) is one launch per layer, and it can
keep the same promise: its arithmetic for a query row is a loop over its tile's key ranges, each cut
into fixed-size chunks from the range's start, with an online softmax in float32. Built `aligned`
(`spans.tile_spans`), the ranges are the sequence's prefix from its first token and each item from
its own first token, never merged, so a token's visible keys fall into the same chunks in the same
order wherever its sequence sits and whatever shares its tile; a range it may not see is masked whole,
and a masked chunk leaves the running max, sum and accumulator exactly as they were (scale exp(0) = 1,
terms 0). What remains is the device's own: a tile row's result must not depend on its place in the
tile, the assumption the fixed-shape matmuls make too (`layers/invariant.py`), checked on the GPU by
tests/cuda_tests/test_deterministic_cuda.py.

What the kernel does not serve goes to the tiles, by a rule that depends on the model and never on the
batch: encoder (bidirectional) batches, and every layer with a sliding window (whether a window bites
depends on the batch's longest sequence, so a per-batch choice would make a token's bits depend on its
batch-mates). Where the kernel cannot run (no triton; the CPU without triton's interpreter) every
layer takes the tiles: a rule of the process, so again never of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kafka_scorer.engine.attention.layout import AttentionLayout, padded_stream, to_device
from kafka_scorer.engine.attention.spans import SpanMetadata
from kafka_scorer.engine.attention.tiled import TiledMetadata, tiled_attention
from kafka_scorer.engine.kernels.runs_on import triton_runs_on


@dataclass(frozen=True)
class AlignedSpanMetadata:
    spans: SpanMetadata | None
    """Aligned spans of a causal batch; None for an encoder batch."""
    tiles: TiledMetadata | None
    """The tiles' metadata where some layer needs them: an encoder batch, a model with windowed layers."""
    backend: ClassVar[str] = "deterministic-spans"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool) -> AlignedSpanMetadata:
        """`pin` is the packer's "the model runs on CUDA" (`batch.py`): where the kernel cannot run there
        (no triton), the tiles are built here once per batch instead of at every layer call."""
        kernel = layout.causal and triton_runs_on(torch.device("cuda" if pin else "cpu"))
        spans = SpanMetadata.build(layout, pin, aligned=True) if kernel else None
        needs_tiles = not kernel or layout.sliding_window is not None
        return cls(spans, TiledMetadata.build(layout, pin) if needs_tiles else None)

    @property
    def layout(self) -> AttentionLayout:
        return self.spans.layout if self.spans is not None else self.tiles.layout  # type: ignore[union-attr]  # build() sets spans or tiles, never neither

    def to(self, device: torch.device) -> AlignedSpanMetadata:
        return to_device(self, device)


def aligned_spans_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: AlignedSpanMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d]; T may exceed the layout's tokens (the mode pads the
    stream to whole row blocks): those rows are 0, as the tiles leave them."""
    spans = metadata.spans
    if spans is None or window is not None:
        return tiled_attention(q, k, v, metadata.tiles, scale, softcap, window)  # type: ignore[arg-type]  # tiles are built whenever spans are absent or a window is named
    tokens = spans.layout.total_tokens
    if not tokens:
        return padded_stream(q[:, :0], q.shape[1])
    attended = _kernel(q[:, :tokens], k[:, :tokens], v[:, :tokens], spans, scale, softcap)
    return padded_stream(attended, q.shape[1])


def _kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spans: SpanMetadata,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    from kafka_scorer.engine.kernels.span_attention_triton import span_attention

    ids = (spans.documents, spans.dense.segments)
    listed = (spans.span_offsets, spans.span_starts, spans.span_ends)
    return span_attention(q, k, v, *ids, *listed, scale, softcap, spans.block_m)
