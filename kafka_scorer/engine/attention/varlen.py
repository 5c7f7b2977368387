"""The varlen backend: a MIS batch as FlashAttention-2 runs, each query run with exactly its own keys.

SPEC §5's mask is, per sequence, one causal run for the shared prefix (the query) and, per item, a run
whose queries are the item's tokens and whose keys are the prefix followed by the item: causal aligned
to the last key, every item token sees the whole prefix and its own item up to itself, and nothing of
the other items. A plain pair is one causal run. So the batch is one variable-length call
(`kernels/flash_varlen.py`) over key rows gathered in run order (the prefix's keys repeated once per
item: on SGLang's shape 120 × 10 extra rows per 1,920-token job), and its cost is the scores the mask
keeps. FlexAttention's 128 × 128 block mask computes about 2.5× that on the same shape (items of 180
tokens straddle its blocks); the cascade pays a merge and many small calls.

Opt-in until a GPU has timed it next to flex and spans (`devtools/gpu_check/`'s attention step and the
0.6B bench): `auto` never picks it. It leaves to the dense path what it does not cover, by rules of the
layer, never of the batch: encoder (bidirectional) batches, soft-capped layers (Gemma 2; the kernel
torch ships takes no cap) and a window shorter than the longest sequence. Where the kernel cannot run
(the CPU, float32, an odd head size) the same runs go through `reference_varlen`, one at a time: that
is how the CPU tests check the runs; the kernel itself is checked by tests/cuda_tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import ClassVar

import torch

from kafka_scorer.engine.attention.dense import DenseMetadata, OverDense, dense_attention
from kafka_scorer.engine.attention.layout import AttentionLayout, host, padded_stream
from kafka_scorer.engine.kernels.flash_varlen import flash_runs_on, flash_varlen, reference_varlen

Run = tuple[int, int, list[tuple[int, int]]]
"""(first query, one past the last, the key ranges it reads in order), in flat stream indices."""


@dataclass(frozen=True)
class VarlenMetadata(OverDense):
    """The runs as the kernel reads them; `key_index` None when every run's keys are its own queries
    (a batch of plain pairs): then the keys are read in place."""

    key_index: torch.Tensor | None
    """[Tk] int64: the stream row of each gathered key row, run after run."""
    cu_q: torch.Tensor
    """[runs + 1] int32: run r's queries are stream rows `cu_q[r]:cu_q[r + 1]`."""
    cu_k: torch.Tensor
    """[runs + 1] int32: its keys are gathered rows `cu_k[r]:cu_k[r + 1]`."""
    max_q: int
    max_k: int
    runs: list[tuple[int, int, int, int]]
    """The same offsets as host ints `(q_start, q_end, k_start, k_end)`, for `reference_varlen`."""
    backend: ClassVar[str] = "varlen"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool) -> VarlenMetadata:
        dense = DenseMetadata.build(layout, pin)
        runs = query_runs(layout) if layout.causal else []
        q_bounds = [0, *accumulate(end - start for start, end, _ in runs)]
        k_bounds = [0, *accumulate(sum(hi - lo for lo, hi in keys) for _, _, keys in runs)]
        if any(start != q_bounds[r] for r, (start, _, _) in enumerate(runs)):
            raise ValueError("varlen attention needs the sequences packed from the stream's start, in order")
        in_place = all(keys == [(start, end)] for start, end, keys in runs)
        index = None
        if not in_place:
            index = torch.cat([torch.arange(lo, hi) for _, _, keys in runs for lo, hi in keys])
        offsets = [(q_bounds[r], q_bounds[r + 1], k_bounds[r], k_bounds[r + 1]) for r in range(len(runs))]
        return cls(
            dense,
            host(index, pin) if index is not None else None,
            host(torch.tensor(q_bounds, dtype=torch.int32), pin),
            host(torch.tensor(k_bounds, dtype=torch.int32), pin),
            max((end - start for start, end, _ in runs), default=0),
            max((b - a for a, b in pairwise(k_bounds)), default=0),
            offsets,
        )


def query_runs(layout: AttentionLayout) -> list[Run]:
    """The batch's runs in stream order; their queries tile the stream's tokens exactly once."""
    runs: list[Run] = []
    for start, length, prefix, items in zip(
        layout.seq_starts, layout.seq_lens, layout.prefix_lens, layout.item_lens
    ):
        if length == 0:
            continue
        if not items:  # a plain pair: one causal run over itself
            runs.append((start, start + length, [(start, start + length)]))
            continue
        items_start = start + prefix
        if prefix:
            runs.append((start, items_start, [(start, items_start)]))
        bounds = list(accumulate(items, initial=items_start))
        for lo, hi in pairwise(bounds):
            if hi > lo:
                runs.append((lo, hi, [(start, items_start), (lo, hi)] if prefix else [(lo, hi)]))
    return runs


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: VarlenMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d]; T may exceed the layout's tokens (a stream padded to
    a CUDA graph's bucket): those rows are 0."""
    layout = metadata.layout
    windowed = window is not None and layout.longest > window
    if not layout.causal or softcap or windowed:
        return dense_attention(q, k, v, metadata.dense, scale, softcap, window)
    tokens = layout.total_tokens
    if not metadata.runs:  # nothing to attend (an empty stream): the kernel takes no empty batch
        return padded_stream(q[:, :0], q.shape[1])
    queries, keys, values = (x.transpose(0, 1)[:tokens] for x in (q, k, v))  # token-major views
    if metadata.key_index is not None:
        keys, values = keys.index_select(0, metadata.key_index), values.index_select(0, metadata.key_index)
    if flash_runs_on(queries):
        attended = flash_varlen(
            queries, keys, values, metadata.cu_q, metadata.cu_k, metadata.max_q, metadata.max_k, scale
        )
    else:
        attended = reference_varlen(queries, keys, values, metadata.runs, scale)
    return padded_stream(attended.transpose(0, 1), q.shape[1])
