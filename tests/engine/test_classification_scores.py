"""Classification / reward heads (score_and_pool) against `model(**pair).logits` (SPEC §4)."""

from __future__ import annotations

import pytest

from kafka_scorer.engine.prepare.score_fields import LABELS_IGNORED_WARNING
from tests.engine.reference import reference_scores

QUERY = "Is this review positive or negative?"
ITEMS = ["The food was great", "The service was slow and the food cold", "ok", "maybe"]


def max_diff(got, want) -> float:
    assert [len(r) for r in got] == [len(r) for r in want]
    return max(abs(g - w) for gr, wr in zip(got, want) for g, w in zip(gr, wr))


@pytest.mark.parametrize(
    ("arch", "num_labels"), [("qwen3", 2), ("qwen2", 12), ("llama", 1), ("qwen3", 12), ("llama", 2)]
)
@pytest.mark.parametrize("apply_softmax", [False, True])
@pytest.mark.parametrize("multi_item", [False, True])
def test_logits_match_reference(scorer_for, tiny_models, arch, num_labels, apply_softmax, multi_item):
    scorer = scorer_for(arch, "classification", num_labels)
    result = scorer.score(QUERY, ITEMS, apply_softmax=apply_softmax, multi_item=multi_item)
    assert result.error is None
    want = reference_scores(
        tiny_models.get(arch, "classification", num_labels), QUERY, ITEMS, apply_softmax=apply_softmax
    )
    assert all(len(row) == num_labels for row in result.scores)
    assert max_diff(result.scores, want) <= (1e-5 if not multi_item else 1e-4)
    if apply_softmax:
        assert all(sum(row) == pytest.approx(1.0, abs=1e-6) for row in result.scores)


def test_label_token_ids_are_ignored_and_reported(scorer_for, tiny_models):
    scorer = scorer_for("qwen3", "classification", 2)
    with_labels = scorer.score(QUERY, ITEMS, label_token_ids=[1, 2, 3])
    without = scorer.score(QUERY, ITEMS)
    assert with_labels.scores == without.scores
    assert with_labels.warnings == [LABELS_IGNORED_WARNING]
    assert without.warnings == []


def test_single_class_model_gives_rows_of_one(scorer_for, tiny_models):
    result = scorer_for("llama", "classification", 1).score(QUERY, ITEMS, apply_softmax=True)
    assert result.scores == [[pytest.approx(1.0)]] * len(ITEMS)
