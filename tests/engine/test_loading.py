"""Loading: kind from the config (not the name), dtypes, sliding windows, the async API."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
import torch

from kafka_scorer.engine.models.loaded import Architecture, ModelLoadError
from kafka_scorer.engine.pack.tensors import from_wire
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Job
from tests.engine.reference import reference_scores

Q = "What is the capital of California?"
ITEMS = ["Sacramento", "Los Angeles", "yes"]


def test_kind_comes_from_the_config_not_the_name(tiny_models, tmp_path):
    misleading = tmp_path / "acme-reward-classifier"
    shutil.copytree(tiny_models.get("llama", "causal"), misleading)
    opened = Scorer(str(misleading), dtype="float32", device="cpu")
    assert opened.describe().loaded.architecture is Architecture.CAUSAL_LM
    named_lm = tmp_path / "acme-causal-lm"
    shutil.copytree(tiny_models.get("qwen2", "classification", 12), named_lm)
    opened = Scorer(str(named_lm), dtype="float32", device="cpu")
    assert opened.describe().loaded.architecture is Architecture.CLASSIFICATION


def test_unknown_architecture_and_missing_model_fail_with_a_readable_message(tiny_models, tmp_path):
    odd = tmp_path / "odd"
    shutil.copytree(tiny_models.get(), odd)
    config = json.loads((odd / "config.json").read_text())
    config["architectures"] = ["Qwen3Model"]
    (odd / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="ForCausalLM or \\*ForSequenceClassification"):
        Scorer(str(odd), device="cpu")
    with pytest.raises(ModelLoadError, match="cannot load config"):
        Scorer(str(tmp_path / "does-not-exist"), device="cpu")


@pytest.mark.parametrize(("dtype", "wire"), [("bfloat16", "bfloat16"), ("float16", "float16")])
def test_half_precision_serves_close_scores_and_hidden_states_in_model_dtype(tiny_models, dtype, wire):
    scorer = Scorer(str(tiny_models.get()), dtype=dtype, device="cpu")
    result = scorer.score(
        Q, ITEMS, label_token_ids=[5, 6], apply_softmax=True, return_pooled_hidden_states=True
    )
    want = reference_scores(tiny_models.get(), Q, ITEMS, [5, 6], apply_softmax=True)
    assert result.pooled_hidden_states.dtype == wire
    assert from_wire(result.pooled_hidden_states).dtype == getattr(torch, dtype)
    assert max(abs(g - w) for gr, wr in zip(result.scores, want) for g, w in zip(gr, wr)) < 0.05


def test_sliding_window_models_fall_back_to_exact_single_pairs(tmp_path):
    from transformers import AutoModelForCausalLM

    from kafka_scorer.checkpoints.tiny_models import build_tokenizer, tiny_config

    tokenizer = build_tokenizer(tmp_path)
    config = tiny_config("qwen2", "causal", vocab_size=len(tokenizer))
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 6, 0
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    scorer = Scorer(str(tmp_path), dtype="float32", device="cpu")
    assert scorer.describe().loaded.sliding_window == 6
    job = Job(query=Q, items=ITEMS, label_token_ids=[5, 6])
    assert not scorer.engine.prepare(job, "x").packed  # the packed sequence would exceed the window
    result = scorer.score_jobs([job])[0]
    want = reference_scores(tmp_path, Q, ITEMS, [5, 6])  # pairs are longer than the window too
    assert max(abs(g - w) for gr, wr in zip(result.scores, want) for g, w in zip(gr, wr)) <= 1e-5
    forced = scorer.score_jobs([Job(query=Q, items=ITEMS, label_token_ids=[5], multi_item=True)])[0]
    assert forced.error.code.value == "unsupported"


def test_score_async_runs_off_the_event_loop(scorer_for):
    scorer = scorer_for()

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        results = await asyncio.gather(
            *(scorer.score_async(Q, ITEMS, label_token_ids=[1, 2]) for _ in range(4))
        )
        task.cancel()
        return results, ticks

    results, ticks = asyncio.run(main())
    sync = scorer.score(Q, ITEMS, label_token_ids=[1, 2])
    assert all(r.scores == sync.scores for r in results)
    assert ticks > 0
