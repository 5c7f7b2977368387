"""No compile in service (issue 24): after the `warm_up`, batches of any size compile nothing new, and
the compiled fused layers score what transformers' own layers score (float32).

The fused decoder's regions and FlexAttention are compiled with dynamic token counts at warm-up; a
graph compiled later would stall a live batch for seconds (the first minute's p99). The `cpu` variant
compiles the fused regions on the CPU (`decoder_forward="compiled"`, what CUDA runs by default), so CI
holds the dynamic-shape contract; the `cuda` variant adds compiled FlexAttention.
"""

from __future__ import annotations

import random

import pytest

from kafka_scorer.wire.protocol import Job
from tests.cuda_tests.devices import DEVICES, on_cuda


def _batch(rng: random.Random, vocab: int) -> list[Job]:
    return [
        Job(
            id=str(n),
            query=[rng.randrange(vocab) for _ in range(rng.randint(1, 40))],
            items=[
                [rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(rng.randint(1, 6))
            ],
            label_token_ids=[1, 2],
            multi_item=rng.choice([None, False, True]),
        )
        for n in range(rng.randint(1, 4))
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_varied_batches_after_the_warm_up_compile_nothing(tiny_models, device: str) -> None:
    from torch._dynamo.utils import counters

    from kafka_scorer.engine.models.decoder import FusedDecoder
    from kafka_scorer.engine.scorer import Scorer

    forward = "auto" if on_cuda(device) else "compiled"
    scorer = Scorer(str(tiny_models.get()), dtype="float32", device=device, decoder_forward=forward)
    assert isinstance(scorer.describe().loaded.body, FusedDecoder)
    reference = Scorer(str(tiny_models.get()), dtype="float32", device="cpu", decoder_forward="transformers")
    scorer.engine.warm_up()
    compiled = counters["stats"]["unique_graphs"]
    rng = random.Random(5)
    for _ in range(24 if on_cuda(device) else 8):
        jobs = _batch(rng, scorer.describe().loaded.input_vocab_size)
        for got, want in zip(scorer.score_jobs(jobs), reference.score_jobs(jobs), strict=True):
            assert got.error is None and want.error is None
            diff = max(abs(a - b) for ga, wa in zip(got.scores, want.scores) for a, b in zip(ga, wa))
            assert diff <= 1e-4
    assert counters["stats"]["unique_graphs"] == compiled
