"""The baseline is the benchmark's yardstick for correctness too, so it is checked against the
independent reference: a plain transformers forward of one pair at a time (tests/engine/reference.py).
Padded rows of different lengths, both softmax modes, and a classification model."""

from __future__ import annotations

import random

import pytest
import torch

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.baseline import BaselineScorer
from kafka_scorer_bench.models import FIRST_REGULAR_ID
from tests.engine.reference import reference_scores


def _jobs(vocab: int, labels: list[int] | None) -> list[Job]:
    rng = random.Random(7)

    def ids(n: int) -> list[int]:
        return [rng.randrange(FIRST_REGULAR_ID, vocab) for _ in range(n)]

    return [
        Job(query=ids(9), items=[ids(3), ids(11), ids(1)], label_token_ids=labels, apply_softmax=False),
        Job(query=ids(4), items=[ids(6), ids(2)], label_token_ids=labels, apply_softmax=True),
        Job(query=ids(13), items=[ids(5)], label_token_ids=labels, apply_softmax=False),
    ]


@pytest.mark.parametrize("kind", ["causal", "classification"])
def test_baseline_matches_one_pair_at_a_time_reference(tiny_models, kind: str) -> None:
    path = tiny_models.get("qwen3", kind)
    scorer = BaselineScorer(str(path), dtype=torch.float32, device=torch.device("cpu"))
    vocab = scorer.model.config.vocab_size
    labels = [FIRST_REGULAR_ID + 1, vocab - 1, FIRST_REGULAR_ID + 5] if kind == "causal" else None
    jobs = _jobs(vocab, labels)
    # A budget small enough to split jobs over several padded batches.
    assert len(scorer.plan(jobs, max_batch_tokens=40)) > 1
    got, padded = scorer.score_jobs(jobs, max_batch_tokens=40)
    assert padded >= sum(len(j.query) + len(i) for j in jobs for i in j.items)
    for job, rows in zip(jobs, got):
        want = reference_scores(path, job.query, job.items, job.label_token_ids, job.apply_softmax)
        assert len(rows) == len(want)
        for row, ref in zip(rows, want):
            assert row == pytest.approx(ref, abs=1e-5)
