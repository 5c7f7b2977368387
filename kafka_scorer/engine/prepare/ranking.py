"""The order of a job's items: `ranking` (SPEC §8), the best `top_n` items by one score column, and
`results` (SPEC §10), the rerank shape's documents by relevance, highest first.

A reranking pipeline wants the order, not N rows to sort itself in every consumer. Ties go to the
lower index, so equal scores rank the same way on every run and on every worker. A NaN score (a
broken checkpoint can produce one) ranks below every number instead of making the order depend on
where the sort happened to meet it. `scores` stays complete; this only adds the order.

Both orders go by one relevance per row (`engine/prepare/relevance.py`). A CausalLM job whose rows are
full-vocabulary label probabilities (no `apply_softmax`) of several labels, when it is templated or in
the rerank shape, is *normalised*: the label's share of its labels, `P(yes) / (P(yes) + P(no))`, the
score Qwen3-Reranker's model card defines (issue 26: an example of the docs ranked by the raw value
came out 1, 0, 2 where the card's score orders 1, 2, 0). Every other job reads its `rank_by` column as
scored (a classifier's or cross-encoder's class after its activation; a kind with one score column,
such as a late-interaction MaxSim, that column).
"""

from __future__ import annotations

import math

from kafka_scorer.engine.prepare.documents import echo, is_rerank
from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.engine.prepare.relevance import relevance
from kafka_scorer.wire.protocol import Job, Ranked, Reranked


def order(scores: list[float], top_n: int | None = None) -> list[int]:
    """Indices by score, highest first, ties by lower index, NaN last; the first `top_n` of them."""

    def key(index: int) -> tuple[float, int]:
        score = scores[index]
        return (math.inf if math.isnan(score) else -score, index)

    return sorted(range(len(scores)), key=key)[:top_n]


def rank(rows: list[list[float]], column: int, top_n: int, normalised: bool = False) -> list[Ranked]:
    """The best `top_n` rows by relevance, each with the relevance it ranked by as its score."""
    scores = [relevance(row, column, normalised) for row in rows]
    return [Ranked(index=index, score=scores[index]) for index in order(scores, top_n)]


def ranking(job: Job, rows: list[list[float]], column: int, normalised: bool = False) -> list[Ranked] | None:
    """A result's `ranking`: when the job sent `top_n`, unless it is in the rerank shape (`results`)."""
    if job.top_n is None or is_rerank(job):
        return None
    return rank(rows, column, job.top_n, normalised)


def reranked(job: PreparedJob, rows: list[list[float]]) -> list[Reranked] | None:
    """A result's `results` for a job in the rerank shape (None otherwise): every document, or the
    best `top_n`, by relevance; each with its document when the job asked for them."""
    if not is_rerank(job.job):
        return None
    scores = [relevance(row, job.rank_by, job.rank_normalised) for row in rows]
    documents = job.job.documents if job.job.return_documents else None
    return [
        Reranked(
            index=index,
            relevance_score=scores[index],
            document=echo(documents[index]) if documents else None,
        )
        for index in order(scores, job.job.top_n)
    ]
