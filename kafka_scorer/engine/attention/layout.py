"""AttentionLayout: which tokens of the flat stream see which, as lengths only.

Built by `engine/pack/batch.py` from lengths known at tokenization time; every backend's metadata is
derived from it on the packing thread, so nothing on the device scans tokens to find a boundary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class AttentionLayout:
    """Where each sequence starts, how long its shared prefix (the query) is and how long each item
    after it is. A plain pair is a sequence with no items."""

    seq_starts: list[int]
    seq_lens: list[int]
    prefix_lens: list[int]
    item_lens: list[tuple[int, ...]]
    sliding_window: int | None = None
    """The model's window, for layers whose call does not name their own (see `scorer_attention`)."""
    causal: bool = True
    """False for encoders: plain pairs only, each token sees its whole pair (a window is then |i - j|)."""
    cuts: list[tuple[int, ...]] | None = None
    """Per sequence, where its leading run (a packed query, or a plain pair) may be cut for the prefix
    cache (the job's prefix marks, in the sequence's own coordinates, ascending): read only by
    deterministic mode's CPU attention (`segmented.py`), which computes each piece as a run of its own
    so that a prefix's states are the same whether it was cached or not."""

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def longest(self) -> int:
        return max(self.seq_lens, default=0)


def segment_ids(prefix_len: int, item_lens: tuple[int, ...]) -> torch.Tensor:
    """0 for prefix tokens, k+1 for tokens of item k (CPU)."""
    parts = [torch.zeros(prefix_len, dtype=torch.int32)]
    parts += [torch.full((n,), k + 1, dtype=torch.int32) for k, n in enumerate(item_lens)]
    return torch.cat(parts)


def host(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    """A CPU tensor the device copy can read asynchronously: pinned when the model runs on CUDA."""
    return tensor.pin_memory() if pin else tensor


def to_device(value: T, device: torch.device) -> T:
    """`value` with every tensor in it (through dataclass fields and lists) copied to `device`
    without blocking; the metadata's `.to(device)`."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)  # type: ignore[return-value]  # T is the tensor's own type here; mypy cannot narrow a TypeVar
    if isinstance(value, list):
        return [to_device(item, device) for item in value]  # type: ignore[return-value]  # as above, for a list of T's items
    if dataclasses.is_dataclass(value) and not isinstance(value, type | AttentionLayout):
        moved = {f.name: to_device(getattr(value, f.name), device) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **moved)
    return value


def padded_stream(attended: torch.Tensor, rows: int) -> torch.Tensor:
    """[H, tokens, d], the attention of a layout's tokens -> [H, rows, d] for a stream padded past them
    (a CUDA graph's bucket, deterministic mode's whole row blocks): the padding rows are 0, as the
    backends that compute every row leave them; token-major underneath, as the layers read it."""
    heads, tokens, dim = attended.shape
    if tokens == rows:
        return attended
    out = attended.new_zeros((rows, heads, dim)).transpose(0, 1)
    out[:, :tokens] = attended
    return out


def bucket_by_length(entries: list[tuple[int, int]], slack: float = 1.25) -> list[list[tuple[int, int]]]:
    """Group (start, length) spans so padding each group to its longest costs at most `slack`.

    One pass, longest first, each group's real tokens kept as a running sum: a batch of thousands of
    short pairs is grouped in linear time (summing the group again for every span was quadratic)."""
    groups: list[list[tuple[int, int]]] = []
    real = 0  # real tokens of the last group
    for start, length in sorted(entries, key=lambda e: -e[1]):
        if groups:
            group = groups[-1]
            if group[0][1] * (len(group) + 1) <= slack * (real + length):
                group.append((start, length))
                real += length
                continue
        groups.append([(start, length)])
        real = length
    return groups
