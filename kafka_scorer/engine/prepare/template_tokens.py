"""A templated job's text -> the shared token run and one token run per item, as one string would give.

SPEC §4's piecewise rule (the leading part with the tokenizer's special tokens, the trailing part
without) is kept: the shared part of the prompt is tokenized once, each item's part once. A
byte-level tokenizer can join the last characters of one piece with the first of the next into a
single token, though: Qwen's pre-tokenizer reads a query's closing `?` and the template's next newline
as one `?\\n` token, while the pieces alone give `?` and `\\n`. The reranker was trained on the prompt
tokenized as one string, so that seam is repaired: the shared part and the first item's part are
tokenized together once per job, and where they disagree at the cut, the disagreeing tail of the
shared part moves into every item's part. The tokens are then those of each whole prompt tokenized as
one string (tests/engine/test_templates.py checks it on generated text), and MIS still computes the
long common head once. Anything the repair cannot prove (a seam inside a multi-byte character, a
tokenizer without offsets) keeps the plain piecewise rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_scorer.engine.prepare.templates import PromptTemplate


@dataclass(frozen=True)
class TemplatedTokens:
    shared: list[int]
    items: list[list[int]]


def tokenize_templated(
    tokenizer, template: PromptTemplate, query: str, items: list[str], instruction: str
) -> TemplatedTokens:
    """The shared part (with special tokens) and each item's part (without), seam repaired."""
    shared_text = template.shared_part(query, instruction)
    parts = [template.item_part(item, instruction) for item in items]
    encoded = tokenizer(shared_text, add_special_tokens=True, return_offsets_mapping=True)
    shared = list(encoded["input_ids"])
    cut = _seam(tokenizer, shared_text, parts[0], shared, encoded["offset_mapping"]) if parts else None
    if cut is not None:
        kept, tail = cut
        item_ids = tokenizer([tail + part for part in parts], add_special_tokens=False)["input_ids"]
        return TemplatedTokens(shared=shared[:kept], items=[list(ids) for ids in item_ids])
    item_ids = tokenizer(parts, add_special_tokens=False)["input_ids"]
    return TemplatedTokens(shared=shared, items=[list(ids) for ids in item_ids])


def _seam(
    tokenizer, shared_text: str, first_part: str, shared: list[int], offsets: list[tuple[int, int]]
) -> tuple[int, str] | None:
    """Where to cut instead of at the end of the shared text: (shared tokens kept, text moved to the
    items), or None when the pieces already tokenize like the whole prompt (or the seam is unprovable).
    """
    whole = list(tokenizer(shared_text + first_part, add_special_tokens=True)["input_ids"])
    if whole[: len(shared)] == shared:
        return None
    kept = common_prefix(shared, whole)
    start, end = offsets[kept]
    if kept == 0 or start == end or offsets[kept - 1][1] > start:
        return None  # a special token or a split character at the seam: keep the piecewise rule
    tail = shared_text[start:]
    moved = list(tokenizer(tail + first_part, add_special_tokens=False)["input_ids"])
    if shared[:kept] + moved != whole:
        return None
    return kept, tail


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cut_item_text(tokenizer, template: PromptTemplate, item: str, instruction: str, room: int) -> str:
    """The longest head of `item` whose templated part fits in `room` tokens (SPEC §8 `truncate`).

    Only the item's own text is cut, never the template's text around it: the fixed part is measured
    with an empty item, the item is cut to the rest in its own tokens and decoded back to text, and
    the cut shrinks until the part, tokenized as it will be, fits (a seam can merge or split a token).
    """
    fixed = len(tokenizer(template.item_part("", instruction), add_special_tokens=False)["input_ids"])
    ids = tokenizer(item, add_special_tokens=False)["input_ids"]
    keep = max(0, room - fixed)
    while keep > 0:
        text = tokenizer.decode(ids[:keep])
        part = tokenizer(template.item_part(text, instruction), add_special_tokens=False)["input_ids"]
        if len(part) <= room:
            return text
        keep -= max(1, len(part) - room)
    return ""
