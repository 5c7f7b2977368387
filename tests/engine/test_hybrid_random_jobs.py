"""Hybrid models (Qwen3.5) under MIS, for generated jobs (issue 38's done-when): random item counts and
lengths, items of one token and empty ones, items shorter than the convolution window and longer than
a delta-rule chunk, several jobs in one batch. Every item's row equals transformers run on its
(query, item) pair alone; a state that leaked from one item or job into the next would move it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_scorer.wire.protocol import Job
from tests.engine.test_hybrid_models import _assert_equals_reference, _scorer

TOKENS = st.integers(min_value=3, max_value=60)
ITEM = st.one_of(
    st.just([]), st.lists(TOKENS, min_size=1, max_size=3), st.lists(TOKENS, min_size=4, max_size=70)
)
JOB = st.tuples(st.lists(TOKENS, min_size=1, max_size=40), st.lists(ITEM, min_size=1, max_size=4))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(JOB, min_size=1, max_size=3))
def test_generated_mis_jobs_of_one_batch_equal_their_pairs_alone(scorer_for, tiny_models, jobs) -> None:
    scorer = _scorer(scorer_for, "qwen3_5", "causal")
    path = tiny_models.get("qwen3_5", "causal", 3)
    batch = [
        Job(id=f"j{n}", query=query, items=items, label_token_ids=[5, 6, 7], multi_item=True)
        for n, (query, items) in enumerate(jobs)
    ]
    for job, result in zip(batch, scorer.score_jobs(batch)):
        assert result.error is None, result.error
        _assert_equals_reference(path, job, result.scores)
