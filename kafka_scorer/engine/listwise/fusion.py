"""A job's scores from its blocks' vectors: what the reference does after its forwards.

Each block gives a projected vector per document and one for the query (read after the documents).
With one block a document's score is the cosine of its vector and the query's. With several
(jinaai/jina-reranker-v3's `modeling.py`, `rerank`): each block's weight is its best
`(1 + cosine) / 2`, the query vector is the blocks' query vectors averaged with those weights, and every
document is scored against that one vector, so scores from different blocks share one reference and
compare (and a strong block moves every document's score a little). Computed in float64, as the
reference's numpy is. A job whose every weight is 0 (each block's best cosine is -1) takes the plain
mean, where the reference would divide by zero.
"""

from __future__ import annotations

import torch


def cosines(documents: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(documents, query[None, :], dim=-1)


def fused_scores(blocks: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """`blocks`: each block's (document vectors [n, d], query vector [d]), in document order."""
    if len(blocks) == 1:
        documents, query = blocks[0]
        return cosines(documents.double(), query.double()).tolist()
    weights = torch.stack([((1 + cosines(d.float(), q.float())) / 2).max() for d, q in blocks]).double()
    queries = torch.stack([q for _, q in blocks]).double()
    if float(weights.sum()) == 0.0:
        weights = torch.ones_like(weights)
    query = (weights[:, None] * queries).sum(0) / weights.sum()
    documents = torch.cat([d for d, _ in blocks]).double()
    return cosines(documents, query).tolist()


def own_scores(blocks: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """`multi_item: false`: every document against the query of its own one-passage prompt."""
    return [score for d, q in blocks for score in cosines(d.double(), q.double()).tolist()]
