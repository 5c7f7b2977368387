"""Long documents on the late-interaction kind (SPEC §9 `chunking`): the best window's MaxSim.

A document whose own tokens do not fit `document_length` (beside the special tokens and the marker), or
are more than the job's `window`, is cut into windows exactly as for the other kinds
(`engine/prepare/chunking.py`: `window` own tokens, `overlap` shared); each window is encoded as a
document of its own (`[CLS] [D] window [SEP]`, its vectors cached by its own content) and scored by
MaxSim, and the item's score is chosen by `aggregate` like any one-column row: `max` the best window's
(its span in `chunks`), `mean` the windows' mean, `first` the first window's (what cutting the document
gives).

Why the best window rather than MaxSim over all windows' vectors at once: it is the score the same window
gets as a document of its own, so a long document is ranked like its best passage (the "max-passage"
rule), `chunks` can name where the match is, and the three aggregates mean what they mean for every other
kind. MaxSim over the union is at least the best window's and grows with the number of windows, so long
documents would outrank short ones for length alone.
"""

from __future__ import annotations

from kafka_scorer.engine.prepare.chunking import (
    ChunkPlan,
    WindowedItem,
    char_spans,
    count_windows,
    window_ranges,
)
from kafka_scorer.engine.prepare.prepared import InputError
from kafka_scorer.wire.protocol import Chunking, ErrorCode

Offsets = list[tuple[int, int]]


def split_documents(
    documents: list[list[int]],
    offsets: list[Offsets | None] | None,
    chunking: Chunking,
    room: int,
    max_windows: int,
) -> tuple[list[list[int]], ChunkPlan | None]:
    """Documents' own tokens -> the windows to encode (a fitting document is one), and the plan mapping
    their rows back; `offsets` (text jobs) give each window's span in characters."""
    window = room if chunking.window is None else min(chunking.window, room)
    if chunking.overlap >= window:
        raise InputError(
            ErrorCode.INVALID_REQUEST,
            f"chunking: overlap {chunking.overlap} must be below the window, {window} tokens "
            "(at most what fits the checkpoint's document_length)",
        )
    over = {index: len(ids) for index, ids in enumerate(documents) if len(ids) > window}
    if not over:
        return documents, None
    total = sum(count_windows(n, window, chunking.overlap) for n in over.values())
    if total > max_windows:
        raise InputError(
            ErrorCode.TOO_LONG,
            f"chunking: the job's long items make {total} windows; the limit is "
            f"max_chunks_per_job={max_windows}",
        )
    windows: list[list[int]] = []
    counts: list[int] = []
    chunked: list[WindowedItem] = []
    for index, ids in enumerate(documents):
        if index not in over:
            windows.append(ids)
            counts.append(1)
            continue
        ranges = window_ranges(len(ids), window, chunking.overlap)
        windows.extend(ids[start:end] for start, end in ranges)
        counts.append(len(ranges))
        if offsets is None:
            chunked.append(WindowedItem(index, ranges, "tokens"))
        else:
            own = offsets[index]
            chunked.append(WindowedItem(index, char_spans(own, ranges) if own else None, "characters"))
    return windows, ChunkPlan(chunking.aggregate, counts, chunked)
