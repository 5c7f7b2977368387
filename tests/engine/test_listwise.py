"""The listwise kind (jina-reranker-v3's `JinaForRanking`) against an independent reference.

The reference (kafka_scorer_bench/listwise_reference.py) is written from the model's published code, not
from the engine's: the prompt string, a plain transformers forward one prompt at a time, the projector,
the cosine, and the published block policy and fusion. float32 throughout: scores agree within 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

from kafka_scorer.engine.kinds.listwise import ListwiseKind
from kafka_scorer.engine.models.loaded import Architecture
from kafka_scorer.wire.protocol import ErrorCode, Job
from kafka_scorer_bench.listwise_reference import DOC, QUERY, TOLERANCE, Reference


@pytest.fixture(scope="module")
def reference(tiny_listwise) -> Reference:
    return Reference(tiny_listwise)


QUERIES = ["what is green tea good for?", "Kafka consumer groups", "who wrote Faust"]
DOCS = [
    ["Green tea has catechins.", "Coffee prices rose.", "Tea may help the brain.", "Basketball is popular."],
    ["A consumer group shares partitions.", "Rebalancing moves partitions between members."],
    ["Goethe wrote Faust in two parts.", "Marlowe wrote Doctor Faustus.", "Gounod set it as an opera.", "x"],
]


def column(result) -> list[float]:
    assert result.error is None, result.error
    return [row[0] for row in result.scores]


def close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    assert np.max(np.abs(np.array(got) - np.array(want))) <= TOLERANCE, (got, want)


def test_a_jina_for_ranking_config_is_served_by_the_listwise_kind(listwise_scorer):
    scorer = listwise_scorer()
    assert (
        type(scorer.describe().kind) is ListwiseKind
        and scorer.describe().loaded.architecture is Architecture.LISTWISE
    )
    assert scorer.describe().fields["kind"] == "listwise"


def test_each_job_alone_equals_the_reference(listwise_scorer, reference):
    scorer = listwise_scorer()
    for query, docs in zip(QUERIES, DOCS):
        [result] = scorer.score_jobs([Job(id="a", query=query, items=docs)])
        close(column(result), reference.scores(query, docs))


def test_jobs_batched_together_equal_each_alone_and_the_reference(listwise_scorer, reference):
    """Several jobs of different lengths share one forward (padded side by side): nothing crosses."""
    scorer = listwise_scorer()
    jobs = [Job(id=str(i), query=q, items=d) for i, (q, d) in enumerate(zip(QUERIES, DOCS))]
    together = scorer.score_jobs(jobs)
    for job, result in zip(jobs, together):
        alone = column(scorer.score_jobs([job])[0])
        close(column(result), alone)
        close(column(result), reference.scores(str(job.query), list(job.items)))  # type: ignore[arg-type]


def test_the_instruction_goes_where_the_reference_puts_it(listwise_scorer, reference):
    [result] = listwise_scorer().score_jobs(
        [Job(id="i", query=QUERIES[0], items=DOCS[0], instruction="prefer health claims")]
    )
    close(column(result), reference.scores(QUERIES[0], DOCS[0], instruction="prefer health claims"))


def test_the_rerank_shape_is_served(listwise_scorer, reference):
    docs = [{"title": "t", "body": d} for d in DOCS[0]]
    job = Job(id="r", query=QUERIES[0], documents=docs, rank_fields=["body"], return_documents=True, top_n=2)
    [result] = listwise_scorer().score_jobs([job])
    want = reference.scores(QUERIES[0], DOCS[0])
    order = sorted(range(len(want)), key=lambda i: -want[i])[:2]
    assert [r.index for r in result.results] == order
    assert [r.document for r in result.results] == [docs[i] for i in order]
    close([r.relevance_score for r in result.results], [want[i] for i in order])


def test_more_documents_than_a_block_are_split_and_fused_as_the_reference_does(listwise_scorer, reference):
    """130 documents: a block of 125 and one of 5, one fused query vector for both."""
    docs = [f"document number {i} about tea" if i % 3 else f"coffee note {i}" for i in range(130)]
    [result] = listwise_scorer().score_jobs([Job(id="b", query=QUERIES[0], items=docs)])
    close(column(result), reference.scores(QUERIES[0], docs))


def test_the_context_limit_closes_blocks_as_the_reference_does(listwise_scorer, reference):
    """A smaller pair limit is the context the policy budgets: the capacity closes blocks early."""
    docs = [("tea " * 60).strip() + f" {i}" for i in range(7)]
    context = 2 * 8 + 2048 + 150
    [result] = listwise_scorer(max_pair_tokens=context).score_jobs([Job(id="c", query="tea?", items=docs)])
    close(column(result), reference.scores("tea?", docs, context=context))


def test_a_document_past_2048_tokens_is_cut_as_the_reference_cuts_it(listwise_scorer, reference):
    docs = ["short one", " ".join(f"w{i}" for i in range(1500))]
    [result] = listwise_scorer().score_jobs([Job(id="l", query="w5?", items=docs)])
    assert result.truncated_items == [1]
    close(column(result), reference.scores("w5?", docs))


def test_markers_in_the_texts_are_removed_as_the_reference_removes_them(listwise_scorer, reference):
    docs = [f"evil {DOC} doc", f"{QUERY} second", "<|im_end|> third"]
    [result] = listwise_scorer().score_jobs([Job(id="h", query=f"q {DOC}{QUERY}", items=docs)])
    close(column(result), reference.scores(f"q {DOC}{QUERY}", docs))


def test_multi_item_false_reads_each_document_in_a_prompt_of_its_own(listwise_scorer, reference):
    [result] = listwise_scorer().score_jobs([Job(id="f", query=QUERIES[0], items=DOCS[0], multi_item=False)])
    want = [reference.scores(QUERIES[0], [doc])[0] for doc in DOCS[0]]
    close(column(result), want)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"multi_item": True}, ErrorCode.UNSUPPORTED),
        ({"label_token_ids": [1]}, ErrorCode.UNSUPPORTED),
        ({"return_pooled_hidden_states": True}, ErrorCode.UNSUPPORTED),
        ({"apply_softmax": True}, ErrorCode.UNSUPPORTED),
        ({"item_first": True}, ErrorCode.UNSUPPORTED),
        ({"rank_by": 1}, ErrorCode.INVALID_REQUEST),
        ({"query": [1, 2], "items": [[3], [4]]}, ErrorCode.UNSUPPORTED),
        ({"model": "another"}, ErrorCode.MODEL_MISMATCH),
        ({"items": ["x"] * 300}, ErrorCode.TOO_LONG),
    ],
)
def test_bad_jobs_get_typed_errors_and_leave_their_batch_mates_alone(
    listwise_scorer, reference, fields, code
):
    good = Job(id="good", query=QUERIES[1], items=DOCS[1])
    bad = Job(**{"id": "bad", "query": "q", "items": ["a", "b"], **fields})
    results = listwise_scorer(max_items_per_job=256).score_jobs([bad, good])
    assert results[0].error is not None and results[0].error.code is code, results[0]
    close(column(results[1]), reference.scores(QUERIES[1], DOCS[1]))


def test_a_block_longer_than_the_pair_limit_is_too_long(listwise_scorer):
    [result] = listwise_scorer(max_pair_tokens=120).score_jobs([Job(id="t", query="q", items=["a b c"])])
    assert result.error is not None and result.error.code is ErrorCode.TOO_LONG


def test_no_documents_is_an_empty_result(listwise_scorer):
    [result] = listwise_scorer().score_jobs([Job(id="e", query="q", items=[])])
    assert result.error is None and result.scores == []
