"""Long items cut into windows, for every kind (SPEC §9 `chunking`): how big a window may be, which items
are over it, and how their windows take their place in the job.

The decoder's and the cross-encoder's preparer (`item_windows.py`) and the late-interaction preparer
(`late_interaction/windows.py`) each decide what a window is (token ids with the special tokens it
needs, a text inside a template, a document to encode) and leave the rest here, so the refusals read the
same on every kind and the plan that maps rows back is built one way. The window rule itself (where
windows start and end, how their rows become one) is `chunking.py`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from kafka_scorer.engine.prepare.chunking import ChunkPlan, WindowedItem, count_windows
from kafka_scorer.engine.prepare.prepared import InputError
from kafka_scorer.wire.protocol import Chunking, ErrorCode

T = TypeVar("T")


def window_size(chunking: Chunking, room: int, bound: str) -> int:
    """The window in an item's own tokens: the job's `window`, at most `room` (`bound` says what sets
    the room, for the message); refused when the overlap leaves the windows no step forward."""
    window = room if chunking.window is None else min(chunking.window, room)
    if chunking.overlap >= window:
        capped = chunking.window is None or chunking.window > room
        raise InputError(
            ErrorCode.INVALID_REQUEST,
            f"chunking: overlap {chunking.overlap} must be below the window, {window} tokens"
            + (f" ({bound})" if capped else ""),
        )
    return window


def long_items(lengths: dict[int, int], window: int, overlap: int, max_windows: int) -> dict[int, int]:
    """The items (index -> own length) over `window`; refused with `too_long` when their windows
    would pass the job's `max_windows` (counted before any window is built)."""
    over = {index: n for index, n in lengths.items() if n > window}
    total = sum(count_windows(n, window, overlap) for n in over.values())
    if total > max_windows:
        raise InputError(
            ErrorCode.TOO_LONG,
            f"chunking: the job's long items make {total} windows; the limit is "
            f"max_chunks_per_job={max_windows}",
        )
    return over


def lay_out(
    items: Sequence[T], windows: dict[int, tuple[list[T], WindowedItem]], aggregate: str
) -> tuple[list[T], ChunkPlan]:
    """Each item of `windows` replaced, in place, by its windows; the plan that maps rows back. Every
    kind's windowing ends here, whatever a window is (token ids, a prompt, a text)."""
    out: list[T] = []
    counts: list[int] = []
    chunked: list[WindowedItem] = []
    for index, item in enumerate(items):
        if index not in windows:
            out.append(item)
            counts.append(1)
            continue
        pieces, windowed = windows[index]
        out.extend(pieces)
        counts.append(len(pieces))
        chunked.append(windowed)
    return out, ChunkPlan(aggregate, counts, chunked)
