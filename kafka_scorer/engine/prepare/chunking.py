"""Long items (SPEC §9 `chunking`): where an item's windows start and end, and how their rows become one.

An item too long for one pair (or longer than the job's `window`) is cut on token boundaries into
windows of at most `W` of its own tokens, consecutive windows sharing `overlap` tokens:

    stride = W - overlap                     (at least 1)
    window k = tokens [k * stride, min(k * stride + W, n))
    the last window is the first one that reaches the item's end n

so an item of n > W tokens has `1 + ceil((n - W) / stride)` windows, every token is in at least one,
and only the last window can be shorter than W. Each window is then scored as its own pair (the
preparer in inputs.py builds the pairs); this module only knows token counts, never the model.

The rows of an item's windows become its row here, after the forward (`aggregate`):
- `max`: the whole row of the window with the highest relevance score (the `rank_by` column, or its
  share of the row for a templated or rerank-shaped CausalLM job: `engine/prepare/ranking.py`); ties go
  to the earlier window and a NaN ranks below every number, as in `ranking`;
- `mean`: the element-wise mean of the windows' rows;
- `first`: the first window's row (what truncating the item to W tokens gives).
Pooled hidden states follow the same choice: the chosen window's vector, or the mean of the windows'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafka_scorer.engine.prepare.relevance import relevance
from kafka_scorer.wire.protocol import ChunkedItem

if TYPE_CHECKING:  # the prepare stage imports no torch (tests/test_layout.py); `aggregate` gets it late
    import torch

Span = tuple[int, int]


def window_ranges(length: int, window: int, overlap: int) -> list[Span]:
    """The [start, end) token ranges of an item of `length` tokens (one range when it fits)."""
    if length <= window:
        return [(0, length)]
    stride = window - overlap
    return [(start, min(start + window, length)) for start in range(0, length - window + stride, stride)]


def count_windows(length: int, window: int, overlap: int) -> int:
    """`len(window_ranges(...))` without building them: checked against the cap before any list."""
    if length <= window:
        return 1
    return 1 + math.ceil((length - window) / (window - overlap))


def char_spans(offsets: list[tuple[int, int]], ranges: list[Span]) -> list[Span]:
    """Token ranges -> character ranges of the text, from the tokenizer's offsets.

    A byte-level token that holds part of a multi-byte character maps to that whole character, so a
    window that starts or ends inside one still has a span on character boundaries (it includes the
    character).
    """
    return [(offsets[start][0], offsets[end - 1][1]) for start, end in ranges]


@dataclass(frozen=True)
class WindowedItem:
    """One item scored as several windows: where they lie in the item, in the unit the caller sent."""

    index: int
    spans: list[Span] | None
    """Per window, [start, end) in `unit`; None when a text item's tokenizer gives no offsets."""
    unit: str
    """"tokens" (token-id items) or "characters" (text items)."""


@dataclass
class ChunkPlan:
    """How a job's scoring rows (one per window) map back to its items."""

    aggregate: str
    windows: list[int]
    """Rows of each item, in item order: 1 for an item that fits, its window count otherwise."""
    chunked: list[WindowedItem] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return sum(self.windows)


def aggregate(
    plan: ChunkPlan,
    rows: list[list[float]],
    rank_by: int,
    hidden: torch.Tensor | None,
    normalised: bool = False,
) -> tuple[list[list[float]], torch.Tensor | None, list[ChunkedItem]]:
    """Window rows -> item rows (and hidden states), plus the `chunks` entries of the result. `max`
    picks by the score the job ranks by (`normalised`: the label-normalised one, ranking.py)."""
    assert len(rows) == plan.num_rows, (len(rows), plan.num_rows)
    chunked = {item.index: item for item in plan.chunked}
    out_rows: list[list[float]] = []
    out_hidden: list[torch.Tensor] = []
    report: list[ChunkedItem] = []
    start = 0
    for index, count in enumerate(plan.windows):
        window_rows = rows[start : start + count]
        chosen = _choose(plan.aggregate, window_rows, rank_by, normalised)
        if chosen is None:
            out_rows.append([math.fsum(column) / count for column in zip(*window_rows)])
        else:
            out_rows.append(window_rows[chosen])
        if hidden is not None:
            part = hidden[start : start + count]
            out_hidden.append(part.mean(0) if chosen is None else part[chosen])
        if index in chunked:
            report.append(_entry(chunked[index], count, chosen))
        start += count
    if hidden is None:
        return out_rows, None, report
    import torch  # on the result side only, where the hidden states already are tensors

    return out_rows, torch.stack(out_hidden), report


def _choose(how: str, rows: list[list[float]], rank_by: int, normalised: bool) -> int | None:
    """The window whose row is the item's; None for `mean` of several windows."""
    if len(rows) == 1 or how == "first":
        return 0
    if how == "mean":
        return None

    def key(window: int) -> tuple[float, int]:
        score = relevance(rows[window], rank_by, normalised)
        return (math.inf if math.isnan(score) else -score, window)

    return min(range(len(rows)), key=key)


def _entry(item: WindowedItem, count: int, chosen: int | None) -> ChunkedItem:
    span = None if chosen is None or item.spans is None else item.spans[chosen]
    return ChunkedItem(index=item.index, windows=count, unit=item.unit, window=chosen, span=span)  # type: ignore[arg-type]  # unit is the wire's literal, checked when the job was decoded
