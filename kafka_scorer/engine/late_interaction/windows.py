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
    window_ranges,
)
from kafka_scorer.engine.prepare.windows import lay_out, long_items, window_size
from kafka_scorer.wire.protocol import Chunking

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
    window = window_size(chunking, room, "at most what fits the checkpoint's document_length")
    over = long_items(dict(enumerate(map(len, documents))), window, chunking.overlap, max_windows)
    if not over:
        return documents, None
    windows: dict[int, tuple[list[list[int]], WindowedItem]] = {}
    for index in over:
        ids = documents[index]
        ranges = window_ranges(len(ids), window, chunking.overlap)
        if offsets is None:
            windowed = WindowedItem(index, ranges, "tokens")
        else:
            own = offsets[index]
            windowed = WindowedItem(index, char_spans(own, ranges) if own else None, "characters")
        windows[index] = ([ids[start:end] for start, end in ranges], windowed)
    return lay_out(documents, windows, chunking.aggregate)
