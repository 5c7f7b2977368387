"""Identical calls give identical scores in the default engine (issue 40 item 5), the prefix cache on.

SGLang's own test scores the same request twice and asserts the same scores. Here the first call of a
job finds nothing cached, a later one hits the head the earlier call left: the engine computes a head
alone before the forward that uses it, cached or not (`engine/pack/prefix_batch.py`), so every call runs
the same hit forward against the same stored states. Each call is also checked against the
independent reference (plain transformers, one pair at a time), so identical-but-wrong fails too.
"""

from __future__ import annotations

import pytest

from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Job
from tests.engine.reference import reference_scores

LABELS = [3, 44, 120]
CALLS = 4
"""Cold (the head computed alone and kept), then hits of the kept head."""


def default_scorer(path, template: str = "") -> Scorer:
    """The engine as a worker starts it: every setting at its default (the prefix cache auto)."""
    return Scorer(str(path), dtype="float32", device="cpu", template=template)


def judge_template(tmp_path) -> str:
    file = tmp_path / "judge.txt"
    file.write_text("a rubric to judge by, rule after rule; " * 6 + "{instruction}\nQ: {query}\nA: {item}")
    return str(file)


def assert_identical_and_right(results, path, prepared, labels):
    first = results[0]
    assert first.error is None
    for again in results[1:]:
        assert again.scores == first.scores  # bit for bit
    want = reference_scores(path, prepared.query, prepared.items, labels)
    got = first.scores
    assert max(abs(x - y) for a, b in zip(got, want) for x, y in zip(a, b)) <= 1e-5


@pytest.mark.parametrize("templated", [False, True], ids=["token-ids", "templated"])
@pytest.mark.parametrize("multi_item", [True, False], ids=["mis", "pairs"])
@pytest.mark.parametrize("kind", ["causal", "classification"])
def test_the_same_job_scored_again_gives_the_same_bits(tiny_models, tmp_path, kind, multi_item, templated):
    path = tiny_models.get("qwen3", kind, 2)
    scorer = default_scorer(path, judge_template(tmp_path) if templated else "")
    labels = LABELS if kind == "causal" else None
    if templated:
        query, items = "what is the boiling point of water at sea level?", ["100 C", "50 C", ""]
    else:
        query, items = list(range(10, 130)), [[5, 6, 7], [8, 9], [11], []]
    results = [
        scorer.score(query, items, label_token_ids=labels, multi_item=multi_item) for _ in range(CALLS)
    ]
    served = [result.cached_tokens for result in results]
    # the first call ran its head once (a pair job's other pairs reuse it), the last was served it
    assert served[0] == (0 if multi_item else (len(items) - 1) * served[-1] // len(items))
    assert served[-1] > 0
    prepared = scorer.engine.prepare(Job(query=query, items=items, label_token_ids=labels), "p")
    assert_identical_and_right(results, path, prepared, labels)


@pytest.mark.parametrize("kind", ["causal", "classification"])
def test_a_batch_sharing_new_heads_scored_again_gives_the_same_bits(tiny_models, tmp_path, kind):
    """Several jobs in one batch share a head nobody computed yet (one query, and a template's head
    under different queries): the batch scored again, now hitting, gives each job the same bits."""
    path = tiny_models.get("qwen3", kind, 2)
    scorer = default_scorer(path, judge_template(tmp_path))
    labels = LABELS if kind == "causal" else None
    questions = ["why is the sky blue?", "why is the sky blue?", "how far is the moon?", "is ice water?"]
    jobs = [
        Job(id=str(n), query=q, items=["light", "no idea", ""][: 1 + n % 3], label_token_ids=labels)
        for n, q in enumerate(questions)
    ]
    runs = [scorer.score_jobs(jobs) for _ in range(CALLS)]
    assert sum(r.cached_tokens for r in runs[-1]) > sum(r.cached_tokens for r in runs[0])
    for n, job in enumerate(jobs):
        prepared = scorer.engine.prepare(job, "p")
        assert_identical_and_right([run[n] for run in runs], path, prepared, labels)
