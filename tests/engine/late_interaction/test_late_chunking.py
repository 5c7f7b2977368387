"""`chunking` on the late-interaction kind: a long document's windows are each encoded as a document of
their own, and the item's score is the best window's MaxSim (`max`), the windows' mean or the first's.

Reference: sentence-transformers' MultiVectorEncoder scoring each window's text as a document. The
documents are vocabulary words, one token each, so a window of W tokens is W words of the text."""

from __future__ import annotations

import random
import statistics

import pytest

from kafka_scorer.wire.protocol import Chunking
from tests.engine.late_interaction.test_late_scores import TOLERANCE, reference_scores

WINDOW, OVERLAP = 10, 3


@pytest.fixture(scope="module")
def words(colbert_scorer) -> list[str]:
    vocab = colbert_scorer().describe().loaded.tokenizer.get_vocab()
    return sorted(w for w in vocab if w.isalpha() and w.islower() and len(w) > 2)


def windows_of(text: str) -> list[tuple[str, tuple[int, int]]]:
    """Each window's text and its [start, end) in characters of `text`."""
    spans, position = [], 0
    for word in text.split(" "):
        spans.append((position, position + len(word)))
        position += len(word) + 1
    stride = WINDOW - OVERLAP
    starts = range(0, len(spans) - WINDOW + stride, stride) if len(spans) > WINDOW else [0]
    out = []
    for start in starts:
        end = min(start + WINDOW, len(spans))
        out.append((text[spans[start][0] : spans[end - 1][1]], (spans[start][0], spans[end - 1][1])))
    return out


@pytest.mark.parametrize("aggregate", ["max", "mean", "first"])
def test_windows_score_as_documents_of_their_own(colbert_scorer, reference_encoder, words, aggregate):
    rng = random.Random(5)
    short = " ".join(rng.choice(words) for _ in range(6))
    long = " ".join(rng.choice(words) for _ in range(31))
    query = " ".join(rng.choice(words) for _ in range(5))
    tokenizer = colbert_scorer().describe().loaded.tokenizer
    assert len(tokenizer(long, add_special_tokens=False)["input_ids"]) == 31  # one token per word
    chunking = Chunking(window=WINDOW, overlap=OVERLAP, aggregate=aggregate)
    result = colbert_scorer().score(query, [short, long], chunking=chunking)
    assert result.error is None and result.truncated_items == []
    encoder = reference_encoder()
    [short_score] = reference_scores(encoder, query, [short])
    windows = windows_of(long)
    per_window = reference_scores(encoder, query, [text for text, _ in windows])
    expected = {"max": max(per_window), "mean": statistics.fmean(per_window), "first": per_window[0]}
    assert [row[0] for row in result.scores] == pytest.approx(
        [short_score, expected[aggregate]], abs=TOLERANCE
    )
    [entry] = result.chunks
    assert entry.index == 1 and entry.windows == len(windows) == 4 and entry.unit == "characters"
    if aggregate == "max":
        best = max(range(len(per_window)), key=lambda k: per_window[k])
        assert entry.window == best and entry.span == windows[best][1]


def test_documents_that_fit_are_scored_as_without_chunking(colbert_scorer, words):
    rng = random.Random(6)
    documents = [" ".join(rng.choice(words) for _ in range(n)) for n in (3, 8, 12)]
    plain = colbert_scorer().score("a query", documents)
    chunked = colbert_scorer().score("a query", documents, chunking=Chunking())
    assert chunked.scores == plain.scores and chunked.chunks == []
