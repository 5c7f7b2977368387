"""Items that fit are not split (SPEC §9, docs/message-schema.md "Which items are split"), and a job with
`chunking` packs past the pair limit whether or not an item had to be split (docs/engine.md).

Same references as tests/engine/test_chunking.py (plain transformers one pair at a time; the model
card's whole prompt under a template), whose fixtures' shapes and rule helpers these reuse.
"""

from __future__ import annotations

import pytest

from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Chunking, ErrorCode, Job, Result
from tests.engine.test_chunking import (
    ITEMS,
    LABELS,
    LIMIT,
    QUERY,
    ROOM,
    TEMPLATE_LIMIT,
    assert_rows_close,
    reference_job,
)


@pytest.fixture(scope="module")
def causal(tiny_models):
    path = tiny_models.get("qwen3", "causal")
    return Scorer(str(path), dtype="float32", device="cpu", max_pair_tokens=LIMIT), path


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

    path = build_tiny_reranker(tmp_path_factory.mktemp("fit-reranker"))
    scorer = Scorer(
        str(path), dtype="float32", device="cpu", template="qwen3-reranker", max_pair_tokens=TEMPLATE_LIMIT
    )
    return scorer, path


def test_a_chunking_job_packs_past_the_pair_limit_with_or_without_a_long_item(causal):
    """A job with `chunking` counts as chunked for the packed length whether or not an item had to be
    split (docs/engine.md): one more long item must not turn `too_long` into a pass."""
    scorer, path = causal
    fitting = [ITEMS[0], ITEMS[1], ITEMS[4]]  # each fits a pair; packed they pass the pair limit
    assert len(QUERY) + sum(map(len, fitting)) > LIMIT
    for items in (fitting, [*fitting, ITEMS[3]]):
        result = scorer.score(QUERY, items, label_token_ids=LABELS, multi_item=True, chunking=Chunking())
        assert result.ok, result.error
        want, _ = reference_job(path, QUERY, items, ROOM, 0, "max", 0, LABELS)
        assert_rows_close(result.scores, want)
    plain = scorer.score(QUERY, fitting, label_token_ids=LABELS, multi_item=True)
    assert plain.error is not None and plain.error.code is ErrorCode.TOO_LONG  # without chunking: the limit


def test_a_templated_item_whose_prompt_exactly_fits_is_not_split(templated):
    """docs/message-schema.md: items that fit are scored exactly as without chunking. An item whose
    whole prompt is the pair limit, to the token, is one pair; `window: null` only sizes the windows of
    the items that do not fit."""
    scorer, _ = templated
    query = "Which river is longest?"

    def prompt_tokens(item: str) -> int:
        prepared = scorer.engine.prepare(Job(query=query, items=[item]), "fit")
        if isinstance(prepared, Result):  # too long
            return TEMPLATE_LIMIT + 1
        return len(prepared.query) + len(prepared.items[0])

    words = 1
    while prompt_tokens("river " * (words + 1)) <= TEMPLATE_LIMIT:
        words += 1
    item = "river " * words
    for tail in ("a", "ab", "abc", "b", "the", "x y", "x y z"):  # pad the prompt to the limit exactly
        if prompt_tokens(item) == TEMPLATE_LIMIT:
            break
        if prompt_tokens(item + tail) <= TEMPLATE_LIMIT:
            item += tail
    assert prompt_tokens(item) == TEMPLATE_LIMIT
    items = [item, "The Nile."]
    plain = scorer.score(query, items, multi_item=False)
    for multi_item in (False, None):  # None: a job with `chunking` packs past the pair limit
        chunked = scorer.score(query, items, chunking=Chunking(overlap=3), multi_item=multi_item)
        assert chunked.ok, chunked.error
        assert chunked.chunks == []
        assert_rows_close(chunked.scores, plain.scores)
    # packed, the shared part ran once; as pairs, the same pairs ran as without chunking (the prefix
    # cache, on here, moves tokens between the two counts)
    assert chunked.prompt_tokens + chunked.cached_tokens < plain.prompt_tokens + plain.cached_tokens
    chunked = scorer.score(query, items, chunking=Chunking(overlap=3), multi_item=False)
    assert chunked.prompt_tokens + chunked.cached_tokens == plain.prompt_tokens + plain.cached_tokens
