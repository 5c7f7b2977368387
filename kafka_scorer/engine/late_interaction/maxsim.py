"""MaxSim for one job: for each query vector the best dot product with any token of a document, summed
over the query vectors. One job's [query tokens, document tokens] similarity matrix is formed at a time
(on the device, in float32), never the whole batch's; in deterministic mode one document's at a time
(`maxsim_each`), so a score's arithmetic follows from its document alone, not from the job's others.

The sum over the query vectors is `sum_query_rows`, a fixed pairwise tree of elementwise additions,
not `Tensor.sum(dim=0)`: torch's reduction over the outer dimension of a [query, documents] matrix
vectorises across documents and adds the columns past the last full vector in another order, so equal
documents came back with scores a few ulps apart by their place in the job (issue 40: three copies of
one text scored 16.8860149, 16.8860149, 16.8860168) and ranked by that noise instead of by index. An
elementwise addition rounds each column alone, so a document's score cannot depend on its column.
"""

from __future__ import annotations

import torch


def maxsim(query: torch.Tensor, documents: list[torch.Tensor]) -> torch.Tensor:
    """query [Lq, D], documents [Ld_i, D] each (none empty) -> [len(documents)] float32 scores."""
    lengths = torch.tensor([doc.shape[0] for doc in documents], device=query.device)
    tokens = torch.cat(documents).float()
    similarity = query.float() @ tokens.T  # [Lq, sum Ld]
    owner = torch.repeat_interleave(torch.arange(len(documents), device=query.device), lengths)
    best = torch.full((query.shape[0], len(documents)), float("-inf"), device=query.device)
    best.scatter_reduce_(1, owner.expand(query.shape[0], -1), similarity, reduce="amax")
    return sum_query_rows(best)


def sum_query_rows(best: torch.Tensor) -> torch.Tensor:
    """[Lq, N] -> [N]: each column's sum in an order fixed by Lq alone (halves added elementwise,
    an odd last row carried), so equal columns give bit-equal sums wherever they sit; log2(Lq) ops."""
    while best.shape[0] > 1:
        half = best.shape[0] // 2
        pairs = best[:half] + best[half : 2 * half]
        best = torch.cat([pairs, best[2 * half :]]) if best.shape[0] % 2 else pairs
    return best[0]


def maxsim_each(query: torch.Tensor, documents: list[torch.Tensor]) -> torch.Tensor:
    """`maxsim`, one document at a time: each score's matmul and sum have that document's shape only."""
    q = query.float()
    return torch.stack([(q @ doc.float().T).amax(dim=1).sum() for doc in documents])
