"""MIS (SPEC §5): one packed forward per job gives every item its single-pair score."""

from __future__ import annotations

import pytest
import torch

from kafka_scorer.engine.pack.tensors import from_wire
from tests.engine.reference import reference_hidden, reference_scores

QUERY = "Rank the passages by relevance to the question about rivers"
ITEMS = ["mountains and oceans", "", "rivers", "The quick brown fox jumps over the lazy dog", "", "no"]
LABELS = [3, 44, 120]


def max_diff(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


@pytest.mark.parametrize("backend", ["dense", "cascade"])
@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("apply_softmax", [False, True])
def test_mis_equals_single_item_for_every_item(scorer_for, tiny_models, arch, apply_softmax, backend):
    scorer = scorer_for(arch, attention_backend=backend)
    packed = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, apply_softmax=apply_softmax, multi_item=True)
    single = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, apply_softmax=apply_softmax, multi_item=False)
    want = reference_scores(tiny_models.get(arch), QUERY, ITEMS, LABELS, apply_softmax)
    assert packed.error is None and single.error is None
    assert max_diff(packed.scores, single.scores) <= 1e-4
    assert max_diff(packed.scores, want) <= 1e-4
    # The packed forward really ran fewer tokens: the query once instead of once per item.
    assert packed.prompt_tokens < single.prompt_tokens


@pytest.mark.parametrize("backend", ["dense", "cascade"])
def test_empty_query_with_token_ids(scorer_for, tiny_models, backend):
    items = [[5, 6, 7], [8], [9, 10]]
    packed = scorer_for(attention_backend=backend).score([], items, label_token_ids=LABELS, multi_item=True)
    assert packed.error is None
    assert max_diff(packed.scores, reference_scores(tiny_models.get(), [], items, LABELS)) <= 1e-4


@pytest.mark.parametrize("backend", ["dense", "cascade"])
def test_empty_query_text_keeps_its_special_token(scorer_for, tiny_models, backend):
    packed = scorer_for(attention_backend=backend).score(
        "", ["rivers", "", "oceans"], label_token_ids=LABELS, multi_item=True
    )
    assert packed.error is None
    want = reference_scores(tiny_models.get(), "", ["rivers", "", "oceans"], LABELS)
    assert max_diff(packed.scores, want) <= 1e-4


@pytest.mark.parametrize("kind", ["causal", "classification"])
def test_pooled_hidden_states_mis_vs_single_vs_reference(scorer_for, tiny_models, kind):
    scorer = scorer_for("qwen3", kind, 2)
    labels = LABELS if kind == "causal" else None
    packed = scorer.score(
        QUERY, ITEMS, label_token_ids=labels, multi_item=True, return_pooled_hidden_states=True
    )
    single = scorer.score(
        QUERY, ITEMS, label_token_ids=labels, multi_item=False, return_pooled_hidden_states=True
    )
    plain = scorer.score(QUERY, ITEMS, label_token_ids=labels, multi_item=True)
    assert packed.pooled_hidden_states.dtype == "float32"
    assert packed.pooled_hidden_states.shape == [len(ITEMS), 64]
    assert plain.pooled_hidden_states is None
    assert plain.scores == packed.scores  # asking for hidden states does not change scores
    got_packed = from_wire(packed.pooled_hidden_states)
    got_single = from_wire(single.pooled_hidden_states)
    want = reference_hidden(tiny_models.get("qwen3", kind, 2), QUERY, ITEMS)
    assert torch.allclose(got_packed, got_single, atol=1e-4, rtol=0)
    assert torch.allclose(got_single, want, atol=1e-5, rtol=0)


def test_mis_is_the_default_for_several_items(scorer_for):
    scorer = scorer_for()
    auto = scorer.engine.prepare(__job(QUERY, ITEMS), "a")
    one = scorer.engine.prepare(__job(QUERY, ITEMS[:1]), "b")
    first = scorer.engine.prepare(__job(QUERY, ITEMS, item_first=True), "c")
    assert auto.packed and not one.packed and not first.packed


def __job(query, items, **kw):
    from kafka_scorer.wire.protocol import Job

    return Job(query=query, items=items, label_token_ids=LABELS, **kw)
