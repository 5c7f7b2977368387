"""One bucket's static inputs: the device tensors a captured forward reads, refilled for each batch.

A CUDA graph replays the kernels it recorded against the addresses it recorded, so everything the
forward reads — token ids, positions and the attention metadata (FlexAttention's per-token document and
segment ids, its block index) — lives in buffers allocated once per bucket, and a batch is copied into
them before the replay. The block mask's rule closes over the buffers, so the recorded kernels read the
new batch's ids. A batch whose tensors do not have the bucket's shapes (another backend, a block index
of another size) is refused, and runs without the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kafka_scorer.engine.attention.flex import BLOCK, FlexMetadata
from kafka_scorer.engine.attention.layout import AttentionLayout
from kafka_scorer.engine.pack.batch import ForwardBatch
from kafka_scorer.engine.pack.buckets import padding_lengths


def padding_layout(tokens: int, causal: bool = True) -> AttentionLayout:
    """A stream of `tokens` made of padding sequences only: what the buffers hold until a batch comes."""
    lengths = padding_lengths(0, tokens)
    starts = [BLOCK * index for index in range(len(lengths))]
    return AttentionLayout(starts, lengths, lengths, [()] * len(lengths), causal=causal)


@dataclass
class StaticInputs:
    tokens: int
    input_ids: torch.Tensor
    """[1, tokens] on the device."""
    positions: torch.Tensor
    """[1, tokens] on the device."""
    metadata: FlexMetadata
    """Its tensors on the device; its layout is the padding's (the graph never reads the layout)."""

    @classmethod
    def allocate(cls, tokens: int, device: torch.device) -> StaticInputs:
        metadata = FlexMetadata.build(padding_layout(tokens), pin=False).to(device)
        ids = torch.zeros(1, tokens, dtype=torch.long, device=device)
        positions = torch.zeros(1, tokens, dtype=torch.long, device=device)
        return cls(tokens, ids, positions, metadata)

    def load(self, batch: ForwardBatch) -> bool:
        """Copy `batch` into the buffers (stream-ordered, no sync); False if it does not fit them."""
        pairs = _metadata_pairs(self.metadata, batch.attention)
        if batch.num_tokens != self.tokens or pairs is None:
            return False
        self.input_ids[0].copy_(batch.input_ids, non_blocking=True)
        self.positions[0].copy_(batch.positions, non_blocking=True)
        for static, fresh in pairs:
            static.copy_(fresh, non_blocking=True)
        return True


def _metadata_pairs(static: FlexMetadata, fresh: object) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """(buffer, new value) for every tensor of the flex metadata, or None if `fresh` is not the same
    structure: another backend, a missing tensor, another shape."""
    if not isinstance(fresh, FlexMetadata) or fresh.layout.causal != static.layout.causal:
        return None
    candidates: list[tuple[torch.Tensor, object]] = [
        (static.dense.segments, fresh.dense.segments),
        (static.documents, fresh.documents),
    ]
    fresh_mask = vars(fresh.block_mask)
    for name, value in vars(static.block_mask).items():
        if isinstance(value, torch.Tensor):
            candidates.append((value, fresh_mask.get(name)))
        elif fresh_mask.get(name) is not None and name not in _PLAIN_ATTRIBUTES:
            return None  # the batch's mask has a tensor the buffers lack: not the bucket's structure
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for old, new in candidates:
        if not isinstance(new, torch.Tensor) or new.shape != old.shape:
            return None
        pairs.append((old, new))
    return pairs


_PLAIN_ATTRIBUTES = frozenset({"seq_lengths", "BLOCK_SIZE", "mask_mod"})
"""BlockMask attributes that are not per-batch tensors (the same per bucket, or the rule over buffers)."""
