"""One number per scoring row that says how relevant its item is: what `max` aggregation (SPEC §9)
picks a window by, and what a rerank-shaped result reports as `relevance_score` (SPEC §10).

Usually that is the row's `rank_by` column as scored. A CausalLM job in the rerank shape whose rows
are full-vocabulary label probabilities (no `apply_softmax`) is *normalised*: the column's share of
the row, `P(yes) / (P(yes) + P(no))` for a yes/no reranker. Kept apart from ranking.py and chunking.py,
which both read it, so that neither imports the other.
"""

from __future__ import annotations

import math


def relevance(row: list[float], column: int, normalised: bool = False) -> float:
    """The row's relevance; NaN when a normalised row's probabilities all underflowed to 0."""
    if not normalised:
        return row[column]
    total = math.fsum(row)
    return row[column] / total if total > 0 else math.nan
