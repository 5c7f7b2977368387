"""Long items as windows (SPEC §9): the job preparer's half that decides between truncating and
chunking, sizes the window to the pair limit, and splits items, plain or inside a prompt template.

A mixin of `JobPreparer` (inputs.py): it reads the preparer's limits, tokenizer and template, and
leaves the window rule itself (where windows start and end, how rows aggregate) to chunking.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kafka_scorer.engine.prepare.chunking import (
    ChunkPlan,
    WindowedItem,
    char_spans,
    window_ranges,
)
from kafka_scorer.engine.prepare.prepared import InputError, InputLimits
from kafka_scorer.engine.prepare.template_tokens import tokenize_templated
from kafka_scorer.engine.prepare.text_bounds import leading_special_tokens
from kafka_scorer.engine.prepare.windows import lay_out, long_items, window_size
from kafka_scorer.wire.protocol import Chunking, ErrorCode

if TYPE_CHECKING:
    from kafka_scorer.engine.prepare.templates import PromptTemplate

SEAM_MARGIN = 2
"""Tokens a templated item part may gain at the seam (a token or two of the shared part moves over)."""
_SHRINK_TRIES = 8
"""How often a templated window shrinks to fit before the job is left to the pair limit's `too_long`."""


class ItemWindows:
    limits: InputLimits
    template: PromptTemplate | None

    def _tokenizer(self): ...  # provided by JobPreparer

    def _window(self, chunking: Chunking, room: int) -> int:
        """The window in item tokens: the job's `window`, at most what fits the pair limit (`room`)."""
        if room < 1:
            raise InputError(
                ErrorCode.TOO_LONG,
                f"chunking: the query leaves no room for an item's tokens within the limit "
                f"{self.limits.max_pair_tokens}",
            )
        return window_size(chunking, room, "what fits the pair limit")

    def _long_items(self, lengths: dict[int, int], window: int, overlap: int) -> dict[int, int]:
        return long_items(lengths, window, overlap, self.limits.max_chunks_per_job)

    def _split_decoder_items(
        self,
        query: list[int],
        items: list[list[int]],
        chunking: Chunking,
        texts: Sequence[str] | None,
        item_first: bool,
    ) -> tuple[list[list[int]], ChunkPlan | None]:
        """A decoder's windows: the query stays whole, each window follows it (or leads it, with
        `item_first`) as an item of its own. A leading text item carries the tokenizer's special
        tokens; each of its windows gets them too, and they do not count in the window. `texts`: the
        items' texts for a text job, None for token ids."""
        room = self.limits.max_pair_tokens - len(query)
        if not (item_first and texts is not None):
            return self._split_long_items(items, room, chunking, texts)
        prefix, suffix = leading_special_tokens(self._tokenizer())
        special = len(prefix) + len(suffix)
        own = [len(item) - special for item in items]
        return self._split_long_items(
            items, room - special, chunking, texts, own, lambda ids: [*prefix, *ids, *suffix]
        )

    def _split_long_items(
        self,
        items: list[list[int]],
        room: int,
        chunking: Chunking,
        texts: Sequence[str] | None,
        own: list[int] | None = None,
        wrap=None,
    ) -> tuple[list[list[int]], ChunkPlan | None]:
        """Items over the window -> their windows, in place; the plan maps the rows back (SPEC §9).

        `own` are the items' lengths without special tokens (default: their lengths), `wrap` adds the
        special tokens a window needs. A text item (`texts`: the items' texts, None for token ids) is
        split on its own tokens, read again with the tokenizer's offsets so each window's span is in
        characters of the text.
        """
        window = self._window(chunking, room)
        lengths = own if own is not None else [len(item) for item in items]
        over = self._long_items(dict(enumerate(lengths)), window, chunking.overlap)
        if not over:
            return items, None
        text = texts is not None
        raw = {i: (items[i], None) for i in over} if texts is None else self._own_tokens(texts, sorted(over))
        windows: dict[int, tuple[list[list[int]], WindowedItem]] = {}
        for index in over:
            ids, offsets = raw[index]
            ranges = window_ranges(len(ids), window, chunking.overlap)
            spans = ranges if not text else (char_spans(offsets, ranges) if offsets is not None else None)
            windows[index] = (
                [(wrap or list)(ids[start:end]) for start, end in ranges],
                WindowedItem(index, spans, "characters" if text else "tokens"),
            )
        return lay_out(items, windows, chunking.aggregate)

    def _own_tokens(
        self, items: Sequence[str], indices: list[int]
    ) -> dict[int, tuple[list[int], list[tuple[int, int]] | None]]:
        """Text items' own tokens (no special tokens) with their character offsets, where the
        tokenizer gives offsets (fast tokenizers); without them the spans are left out."""
        tokenizer = self._tokenizer()
        texts = [items[i] for i in indices]
        offsets: list[list[tuple[int, int]] | None]
        try:
            encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
            offsets = [[(start, end) for start, end in row] for row in encoded["offset_mapping"]]
        except NotImplementedError:
            encoded = tokenizer(texts, add_special_tokens=False)
            offsets = [None] * len(texts)
        return {
            index: (list(ids), spans) for index, ids, spans in zip(indices, encoded["input_ids"], offsets)
        }

    def _templated_windows(
        self,
        query: str,
        items: list[str],
        instruction: str,
        room: int,
        chunking: Chunking,
        parts: list[list[int]],
    ) -> tuple[list[int], list[list[int]], ChunkPlan | None]:
        """SPEC §9 under a template: the item's own tokens are split by the window rule, and each
        window's text (the item's characters its tokens cover) is scored inside the template like any
        item, so every window is the whole prompt a caller would build with that text.

        Only an item that does not fit is split: its part (`parts`, the job's parts unchunked) over
        `room`, or its own tokens over the job's `window`; an item whose whole prompt fits is scored as
        without chunking. The window starts at what fits beside the template's text and the seam
        (`SEAM_MARGIN`). A window's text can tokenize to a few more tokens than the window (a window
        that starts or ends inside a multi-byte character takes the whole character), so when a part is
        over the limit the window shrinks by the overflow and the item is split again.
        """
        template = self.template
        assert template is not None
        tokenizer = self._tokenizer()
        fixed = len(tokenizer(template.item_part("", instruction), add_special_tokens=False)["input_ids"])
        window = self._window(chunking, room - fixed - SEAM_MARGIN)
        own = self._own_tokens(items, list(range(len(items))))
        asked = chunking.window
        split = {
            i
            for i, part in enumerate(parts)
            if len(part) > room or (asked is not None and len(own[i][0]) > asked)
        }
        own = {i: own[i] for i in split}
        for _ in range(_SHRINK_TRIES):
            texts, plan = self._window_texts(items, own, window, chunking)
            tokens = tokenize_templated(tokenizer, template, query, texts, instruction)
            limit = self.limits.max_pair_tokens - len(tokens.shared)
            excess = max(len(part) for part in tokens.items) - limit
            if excess <= 0:
                break
            window = self._window(chunking, window - excess)
        return tokens.shared, tokens.items, plan

    def _window_texts(
        self,
        items: list[str],
        own: dict[int, tuple[list[int], list[tuple[int, int]] | None]],
        window: int,
        chunking: Chunking,
    ) -> tuple[list[str], ChunkPlan | None]:
        """Each item of `own` (the items to split) over `window` own tokens replaced by its windows'
        texts, and the plan; the items unchanged and None when none is over."""
        over = self._long_items({i: len(ids) for i, (ids, _) in own.items()}, window, chunking.overlap)
        if not over:
            return items, None
        if any(own[i][1] is None for i in over):
            raise InputError(
                ErrorCode.UNSUPPORTED,
                "chunking a templated text needs the tokenizer's character offsets (a fast tokenizer)",
            )
        windows: dict[int, tuple[list[str], WindowedItem]] = {}
        for index in over:
            ids, offsets = own[index]
            spans = char_spans(offsets, window_ranges(len(ids), window, chunking.overlap))  # type: ignore[arg-type]  # offsets exist for text items, the only ones given spans
            windows[index] = (
                [items[index][start:end] for start, end in spans],
                WindowedItem(index, spans, "characters"),
            )
        return lay_out(items, windows, chunking.aggregate)
