"""CausalLM label scores against a plain transformers forward of each pair (SPEC §4)."""

from __future__ import annotations

import math

import pytest

from tests.engine.reference import reference_scores

QUERY = "What is the capital of California?"
ITEMS = ["Sacramento", "Los Angeles is large", "San Francisco", "yes"]
LABELS = [5, 17, 250, 399]  # 399: past the tokenizer's 384 ids but inside the model's 400-row head


def assert_close(got, want, atol=1e-5, log_rtol=1e-4):
    assert len(got) == len(want)
    for got_row, want_row in zip(got, want):
        assert len(got_row) == len(want_row)
        for g, w in zip(got_row, want_row):
            assert abs(g - w) <= atol, (got_row, want_row)
            assert abs(math.log(g) - math.log(w)) <= log_rtol, (got_row, want_row)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("apply_softmax", [False, True])
def test_text_scores_match_reference(scorer_for, tiny_models, arch, apply_softmax):
    scorer = scorer_for(arch)
    result = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, apply_softmax=apply_softmax, multi_item=False)
    assert result.error is None
    want = reference_scores(tiny_models.get(arch), QUERY, ITEMS, LABELS, apply_softmax)
    assert_close(result.scores, want)
    if apply_softmax:
        for row in result.scores:
            assert sum(row) == pytest.approx(1.0, abs=1e-6)
    else:
        assert all(sum(row) < 1.0 for row in result.scores)


@pytest.mark.parametrize("apply_softmax", [False, True])
def test_token_id_inputs_match_reference(scorer_for, tiny_models, apply_softmax):
    query = [0, 11, 42, 300, 7]
    items = [[1, 2, 3], [399], [250, 251, 252, 253, 254]]
    result = scorer_for().score(query, items, label_token_ids=[3, 9], apply_softmax=apply_softmax)
    assert result.error is None
    assert result.prompt_tokens == len(query) + 9  # packed: the query runs once
    assert_close(result.scores, reference_scores(tiny_models.get(), query, items, [3, 9], apply_softmax))


@pytest.mark.parametrize("apply_softmax", [False, True])
def test_item_first_matches_reference(scorer_for, tiny_models, apply_softmax):
    result = scorer_for().score(
        QUERY, ITEMS, label_token_ids=LABELS, apply_softmax=apply_softmax, item_first=True
    )
    assert result.error is None
    want = reference_scores(tiny_models.get(), QUERY, ITEMS, LABELS, apply_softmax, item_first=True)
    assert_close(result.scores, want)


def test_item_first_changes_the_pair(scorer_for):
    """Guards the reference itself: if item_first were ignored, the test above could not tell."""
    scorer = scorer_for()
    normal = scorer.score(QUERY, ITEMS, label_token_ids=LABELS)
    swapped = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, item_first=True)
    assert max(abs(a - b) for ra, rb in zip(normal.scores, swapped.scores) for a, b in zip(ra, rb)) > 1e-4


def test_repeated_and_single_labels(scorer_for, tiny_models):
    result = scorer_for().score(QUERY, ITEMS[:2], label_token_ids=[7, 7, 7], apply_softmax=True)
    for row in result.scores:
        assert row == pytest.approx([1 / 3] * 3, abs=1e-6)
    one = scorer_for().score(QUERY, ITEMS[:2], label_token_ids=[42])
    assert_close(one.scores, reference_scores(tiny_models.get(), QUERY, ITEMS[:2], [42]))
