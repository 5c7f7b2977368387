"""`ranking` (SPEC §8): the best `top_n` items of a job by one score column, highest first.

A reranking pipeline wants the order, not N rows to sort itself in every consumer. Ties go to the
lower index, so equal scores rank the same way on every run and on every worker. A NaN score (a
broken checkpoint can produce one) ranks below every number instead of making the order depend on
where the sort happened to meet it. `scores` stays complete; this only adds the order.
"""

from __future__ import annotations

import math

from kafka_scorer.wire.protocol import Ranked


def rank(rows: list[list[float]], column: int, top_n: int) -> list[Ranked]:
    def key(index: int) -> tuple[float, int]:
        score = rows[index][column]
        return (math.inf if math.isnan(score) else -score, index)

    order = sorted(range(len(rows)), key=key)[:top_n]
    return [Ranked(index=index, score=rows[index][column]) for index in order]
