"""StreamShape: how one sequence of the packed stream is laid out, as the served kind says.

The packing stage (`batch.py`) lays every kind's sequences out the same way; what differs between a
decoder and an encoder cross-encoder (its positions, the row a lone pair is scored at, whether attention
is causal, what rides beside the token ids) is asked of the shape the kind hands it, so the stage has no
branch per kind. A decoder's is `CAUSAL_STREAM`; an encoder's is its `EncoderSpec`
(`engine/models/encoder_family.py`), which meets this protocol without importing it.
"""

from __future__ import annotations

from typing import Protocol


class StreamShape(Protocol):
    @property
    def causal(self) -> bool:
        """Whether a token sees only the tokens before it (else its whole sequence)."""
        ...

    @property
    def takes_token_types(self) -> bool:
        """Whether the body takes token type ids beside the token ids (a BERT pair)."""
        ...

    @property
    def mean_pooling(self) -> bool:
        """Whether a pair is scored by the mean of its tokens' states (ModernBERT), not one row."""
        ...

    def position_ids(self, ids: list[int]) -> list[int]:
        """The position ids of a sequence's first part (its query, or a whole pair)."""
        ...

    def pair_row(self, start: int, length: int) -> int:
        """The flat row a lone pair of `length` tokens starting at `start` is scored at."""
        ...


class _CausalStream:
    """A decoder's: positions from 0, a pair scored at its last token (the only one that saw it all)."""

    causal = True
    takes_token_types = False
    mean_pooling = False

    def position_ids(self, ids: list[int]) -> list[int]:
        return list(range(len(ids)))

    def pair_row(self, start: int, length: int) -> int:
        return start + length - 1


CAUSAL_STREAM: StreamShape = _CausalStream()
