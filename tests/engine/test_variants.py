"""`engine/run/variants.py`: the bench's side-by-side contenders run the Scorer another way and put it back.

A variant that did not take effect would make the bench's fused-vs-transformers ratio 1.0 for nothing;
one that leaked would make every later contender (and the served Scorer) run the wrong layers."""

from __future__ import annotations

import pytest

from kafka_scorer.engine.api import Layers, layer_choices, variant
from kafka_scorer.wire.protocol import Job
from tests.engine.reference import reference_scores

JOB = Job(id="v", query="rivers and oceans", items=["mountains", "a lake"], label_token_ids=[5, 6])


def _calls(module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_transformers_layers_run_inside_the_variant_only(scorer_for, tiny_models) -> None:
    scorer = scorer_for("qwen3", "causal", decoder_forward="fused", deterministic=False)
    assert Layers.TRANSFORMERS in layer_choices(scorer.describe().loaded)
    hf_layers = _calls(scorer.describe().loaded.model.base_model)
    served = scorer.describe().loaded.body
    prepared = scorer.engine.prepare(JOB, JOB.id)
    with scorer.engine.running(variant(scorer.describe().loaded, "dense", Layers.TRANSFORMERS)):
        inside = scorer.engine.run_batch([prepared])[0]
        assert scorer.describe().attention_backend == "dense"
    assert hf_layers[0] == 1
    after = scorer.engine.run_batch([scorer.engine.prepare(JOB, JOB.id)])[0]
    assert hf_layers[0] == 1 and scorer.describe().loaded.body is served
    want = reference_scores(tiny_models.get("qwen3", "causal", 2), JOB.query, JOB.items, JOB.label_token_ids)
    for result in (inside, after):
        for got_row, want_row in zip(result.scores, want):
            assert got_row == pytest.approx(want_row, rel=1e-4, abs=1e-6)


def test_a_variant_the_model_cannot_run_is_refused(scorer_for) -> None:
    scorer = scorer_for("qwen3", "causal", decoder_forward="transformers")
    assert layer_choices(scorer.describe().loaded) == (Layers.SERVED,)
    with pytest.raises(ValueError, match="cannot run transformers layers"):
        variant(scorer.describe().loaded, None, Layers.TRANSFORMERS)
