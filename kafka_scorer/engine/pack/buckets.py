"""The token counts a forward is padded to so that it can replay a captured CUDA graph.

A graph replays fixed shapes, so a forward of T tokens runs as the smallest bucket B >= T, its last
B - T tokens padding. Buckets double up to 1024 tokens (a lone short job pays at most 2x of very little)
and then step by 1024 (at most 1024 padding tokens, under 13 % at 8192): each bucket is one capture at
warm-up and one set of static buffers, so the list stays short. Every bucket is a whole number of
FlexAttention blocks, so the block index has one shape per bucket.

The padding is sequences of its own (`padding_lengths`): plain causal pairs that end on block
boundaries, so no real token sees them, they see only their own block, and their attention costs one
block each, not the square of the padding.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_scorer.engine.attention.flex import BLOCK

AUTO_GRAPH_TOKENS = 8192
"""`cuda_graph_tokens: -1` on CUDA: forwards up to this size replay graphs. Larger ones keep the GPU busy
long enough that launching each kernel from Python is a small share of their time; small ones (a quiet
minute's lone jobs) are where launches dominate."""

_DOUBLING_UNTIL = 1024
_STEP = 1024


def round_to_block(tokens: int) -> int:
    return -(-tokens // BLOCK) * BLOCK


@dataclass(frozen=True)
class GraphBuckets:
    sizes: tuple[int, ...]
    """Ascending token counts, each a multiple of `BLOCK`."""

    @classmethod
    def up_to(cls, largest: int) -> GraphBuckets:
        """The buckets of forwards up to `largest` tokens (rounded up to a block): none for 0."""
        top = round_to_block(max(0, largest))
        sizes: list[int] = []
        size = BLOCK
        while size < min(top, _DOUBLING_UNTIL):
            sizes.append(size)
            size *= 2
        size = min(size, _DOUBLING_UNTIL)
        while size < top:
            sizes.append(size)
            size += _STEP
        if top:
            sizes.append(top)
        return cls(tuple(sizes))

    def bucket_for(self, tokens: int) -> int | None:
        """The smallest bucket that holds `tokens`, or None when the forward is larger than them all."""
        return next((size for size in self.sizes if size >= tokens), None)


def padding_lengths(tokens: int, bucket: int) -> list[int]:
    """Lengths of the padding sequences that take a stream of `tokens` to `bucket`: the first ends on the
    block boundary after the stream, the others are a block each."""
    lengths: list[int] = []
    end = tokens
    while end < bucket:
        step = min(BLOCK - end % BLOCK, bucket - end)
        lengths.append(step)
        end += step
    return lengths
