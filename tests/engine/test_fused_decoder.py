"""The engine's fused decoder layers (engine/models/, engine/layers/) against transformers' own.

The reference is the checkpoint's transformers layers (`decoder_forward="transformers"`), which the rest
of tests/engine already holds to plain one-pair-at-a-time transformers forwards. Eager fused layers run
the same operations in the same order, so float32 scores are bit-identical; the compiled regions (the
CUDA default) are held to transformers' layers in tests/cuda_tests/test_no_compile_in_service.py, whose `cpu`
variant compiles them on the CPU in CI.
"""

from __future__ import annotations

import random

import pytest
import torch

from kafka_scorer.engine.layers.norm import rms_norm
from kafka_scorer.engine.layers.rotary import half_tables, rotate
from kafka_scorer.engine.models.decoder import FusedDecoder
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Job

ARCHS = ["qwen3", "qwen2", "llama", "gemma2"]


def _jobs(vocab: int, causal: bool, seed: int = 0) -> list[Job]:
    """MIS and plain-pair jobs of varied lengths in one batch."""
    rng = random.Random(seed)
    return [
        Job(
            id=str(i),
            query=[rng.randrange(vocab) for _ in range(rng.randint(1, 40))],
            items=[
                [rng.randrange(vocab) for _ in range(rng.randint(1, 25))] for _ in range(rng.randint(1, 5))
            ],
            label_token_ids=[1, 2, 3] if causal else None,
            multi_item=bool(i % 2),
        )
        for i in range(10)
    ]


def _scores(scorer: Scorer, jobs: list[Job]) -> list[list[list[float]]]:
    results = scorer.score_jobs(jobs)
    assert all(r.error is None for r in results), [r.error for r in results]
    return [r.scores for r in results]


@pytest.mark.parametrize("kind", ["causal", "classification"])
@pytest.mark.parametrize("arch", ARCHS)
def test_eager_fused_layers_equal_transformers_bit_for_bit(scorer_for, arch, kind) -> None:
    fused = scorer_for(arch, kind, decoder_forward="fused")
    reference = scorer_for(arch, kind, decoder_forward="transformers")
    assert isinstance(fused.describe().loaded.body, FusedDecoder)
    assert not isinstance(reference.describe().loaded.body, FusedDecoder)
    jobs = _jobs(fused.describe().loaded.input_vocab_size, kind == "causal")
    assert _scores(fused, jobs) == _scores(reference, jobs)


def test_the_default_is_fused_on_the_cpu(scorer_for) -> None:
    assert isinstance(scorer_for("qwen3", "causal").describe().loaded.body, FusedDecoder)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rms_norm_equals_transformers_in_every_dtype(dtype) -> None:
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    x = (torch.randn(37, 64) * 3).to(dtype)
    llama_style, gemma = Qwen3RMSNorm(64, eps=1e-6).to(dtype), Gemma2RMSNorm(64, eps=1e-6).to(dtype)
    with torch.no_grad():
        llama_style.weight.normal_()
        gemma.weight.normal_()
    assert torch.equal(rms_norm(x, llama_style.weight, 1e-6), llama_style(x))
    assert torch.equal(rms_norm(x, gemma.weight, 1e-6, offset=True), gemma(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotate_equals_transformers_rotary(dtype) -> None:
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    tokens, heads, dim = 23, 4, 16
    angles = torch.arange(tokens)[:, None] * torch.rand(dim // 2)[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    q, k = torch.randn(tokens, heads, dim).to(dtype), torch.randn(tokens, 2, dim).to(dtype)
    want_q, want_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None]
    )
    half_cos, half_sin = half_tables(cos[None], sin[None])
    assert torch.equal(rotate(q, half_cos, half_sin), want_q[0].transpose(0, 1))
    assert torch.equal(rotate(k, half_cos, half_sin), want_k[0].transpose(0, 1))
