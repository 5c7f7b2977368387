"""What a tokenizer's vocabulary says about a text before it is tokenized: how long a text can be and
still fit, and which special tokens lead a pair."""

from __future__ import annotations


def longest_token_chars(tokenizer: object) -> int:
    """Characters in the longest entry of the tokenizer's vocabulary (added tokens included).

    A token covers at most this many characters of the text, so a text of `n` characters has at least
    `n / longest` tokens. Byte-level BPE vocabularies spell one byte per character and a text
    character is at least one byte, so the bound holds for them too.
    """
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]  # transformers types a loaded tokenizer loosely; every tokenizer has get_vocab
    return max((len(token) for token in vocab), default=1) or 1


def leading_special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text that leads a pair (SPEC §4), read
    off a probe encoded with and without them (transformers 5 has no `build_inputs_with_special_tokens`)."""
    bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    return [], []


def text_char_bound(max_tokens: int, longest_token: int) -> int:
    """Most characters a text can have and still tokenize to at most `max_tokens` tokens.

    A text longer than this cannot fit, so it is rejected (or cut, with `truncate`) by its length
    alone, before the tokenizer spends seconds on megabytes that would be thrown away. Tokenizers
    that delete characters before splitting (BERT's drops whitespace and accents and turns a word over
    100 characters into one unknown token) can in principle fit more: a text of that shape longer
    than the bound is `too_long` all the same (see docs/message-schema.md).
    """
    return max_tokens * longest_token
