"""Label tokens by text (SPEC §8 `label_tokens`): resolved once per distinct list with the served tokenizer.

Callers of a yes/no reranker know their labels as words, not as ids of one tokenizer's vocabulary;
an id copied from another model's tokenizer scores the wrong token without any error. A text that is
not exactly one token has no single next-token probability, so it is refused, naming the text and
what it tokenizes to, instead of silently scoring its first piece.
"""

from __future__ import annotations

import threading


class LabelError(ValueError):
    """A label text the served tokenizer cannot turn into exactly one token id."""


class LabelResolver:
    """Text labels -> token ids, memoised: jobs of one pipeline send the same few lists over and over.

    The memo is bounded (cleared when full) because label lists come from the wire, and a producer
    sending a new list per job must not grow the worker's memory without end.
    """

    def __init__(self, tokenizer: object | None, vocab_size: int, max_entries: int = 1024) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._max_entries = max_entries
        self._memo: dict[tuple[str, ...], list[int]] = {}
        self._lock = threading.Lock()

    def resolve(self, texts: list[str]) -> list[int]:
        key = tuple(texts)
        with self._lock:
            ids = self._memo.get(key)
        if ids is None:
            ids = [self._one(text) for text in texts]
            with self._lock:
                if len(self._memo) >= self._max_entries:
                    self._memo.clear()
                self._memo[key] = ids
        return list(ids)

    def _one(self, text: str) -> int:
        if not text:
            raise LabelError("label_tokens: an empty string is not a token")
        if self._tokenizer is None:
            raise LabelError("label_tokens: this model has no tokenizer; send label_token_ids")
        ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]  # transformers types a loaded tokenizer loosely; it is callable
        if len(ids) != 1:
            raise LabelError(
                f"label_tokens: {text!r} is {len(ids)} tokens ({ids[:8]}) for the served tokenizer, not "
                "one; pick a label that is a single token (or send label_token_ids)"
            )
        if not 0 <= ids[0] < self._vocab_size:
            raise LabelError(
                f"label_tokens: {text!r} is token {ids[0]}, outside the model's output vocabulary"
            )
        return ids[0]
