"""An encoder body (transformers' own layers) whose every token is computed alike wherever it sits.

Deterministic mode's encoder counterpart of the fused decoder's `fixed_rows` (`engine/load/deterministic.py`):
the stream of pairs (or ColBERT queries and documents) is padded to whole `ROWS`-row blocks before the
embeddings, so every projection (swapped for `FixedRowsLinear` by `fix_linears`) runs at one fixed shape
and every elementwise op (GELU, LayerNorm, residual adds) over whole vectors, with no scalar tail that
would round one token differently. The padding tokens lie outside the batch's attention layout: the
tiled attention gives them zeros and no real token sees them. The output is cut back to the real rows.
"""

from __future__ import annotations

import torch
from torch import nn

from kafka_scorer.engine.layers.invariant import pad_rows, padded_length
from kafka_scorer.engine.models.encoder_family import EncoderSpec


class FixedRowsEncoder(nn.Module):
    """Called like the transformers encoder it wraps (`input_ids`, `position_ids`, optional
    `token_type_ids`, each [1, T], plus attention kwargs); returns a one-element tuple of [1, T, D]."""

    def __init__(self, body: nn.Module, spec: EncoderSpec) -> None:
        super().__init__()
        self.body = body
        self.pad_id = spec.padding_idx
        # a padding token's own position: always a valid row of the position table (RoBERTa's pad row)
        self.pad_position = spec.padding_idx if spec.positions == "after_padding" else 0

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        **kwargs: object,
    ) -> tuple[torch.Tensor]:
        tokens = input_ids.shape[1]
        rows = padded_length(tokens)
        inputs = {
            "input_ids": _pad(input_ids, rows, self.pad_id),
            "position_ids": _pad(position_ids, rows, self.pad_position),
            **kwargs,
        }
        if token_type_ids is not None:
            inputs["token_type_ids"] = _pad(token_type_ids, rows, 0)
        return (self.body(**inputs)[0][:, :tokens],)


def _pad(values: torch.Tensor, rows: int, fill: int) -> torch.Tensor:
    """[1, T] -> [1, rows], the new entries `fill`."""
    padded = pad_rows(values[0], rows)
    padded[values.shape[1] :] = fill
    return padded[None]
