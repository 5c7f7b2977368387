"""MaxSim for one job: for each query vector the best dot product with any token of a document, summed
over the query vectors. One job's [query tokens, document tokens] similarity matrix is formed at a time
(on the device, in float32), never the whole batch's; in deterministic mode one document's at a time
(`maxsim_each`), so a score's arithmetic follows from its document alone, not from the job's others."""

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
    return best.sum(dim=0)


def maxsim_each(query: torch.Tensor, documents: list[torch.Tensor]) -> torch.Tensor:
    """`maxsim`, one document at a time: each score's matmul and sum have that document's shape only."""
    q = query.float()
    return torch.stack([(q @ doc.float().T).amax(dim=1).sum() for doc in documents])
