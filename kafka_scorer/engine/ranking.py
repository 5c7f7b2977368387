"""`ranking` (SPEC §8): the best `top_n` items of a job by one score column, highest first.

A reranking pipeline wants the order, not N rows to sort itself in every consumer. Ties go to the
lower index, so equal scores rank the same way on every run and on every worker. A NaN score (a
broken checkpoint can produce one) ranks below every number instead of making the order depend on
where the sort happened to meet it. `scores` stays complete; this only adds the order.

A templated CausalLM job without `apply_softmax` ranks by its labels' normalised probability, not by
the full-vocabulary one its `scores` hold: Qwen3-Reranker's card scores P(yes) / (P(yes) + P(no)), and
the two orders can differ (issue 26: an example of the docs ranked by the raw value came out 1, 0, 2
where the card's score orders 1, 2, 0).
"""

from __future__ import annotations

import math

from kafka_scorer.wire.protocol import Ranked


def rank(
    rows: list[list[float]], column: int, top_n: int | None, normalised: bool = False
) -> list[Ranked] | None:
    """None when the job asked for no ranking (`top_n` null). `normalised`: rank by `row[column] /
    sum(row)`, the label-normalised probability a templated reranker's card defines (rows of
    full-vocabulary label probabilities: it equals the softmax over the label logits), and report that
    as the score."""
    if top_n is None:
        return None
    scores = [relevance(row, column, normalised) for row in rows]

    def key(index: int) -> tuple[float, int]:
        score = scores[index]
        return (math.inf if math.isnan(score) else -score, index)

    order = sorted(range(len(rows)), key=key)[:top_n]
    return [Ranked(index=index, score=scores[index]) for index in order]


def relevance(row: list[float], column: int, normalised: bool) -> float:
    """The score a row ranks by: its `column`, or that label's share of the row (see `rank`)."""
    if not normalised:
        return row[column]
    total = math.fsum(row)
    return row[column] / total if total > 0 else math.nan
