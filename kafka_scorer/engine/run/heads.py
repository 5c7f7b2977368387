"""Scoring heads applied to the pooled rows only (one row per item), never to every token.

CausalLM (SPEC §4): `apply_softmax` rows need only their label logits, `h · W[labels]ᵀ`; the other rows
need full-vocabulary log-probabilities, i.e. a log-sum-exp over the vocabulary, which the kernels in
`engine/kernels` compute without materialising `[rows, vocab]` logits. A soft-capped head (Gemma 2) caps
every logit before either use, as transformers' CausalLM forward does.
Classification: the model's own head on the rows, optional softmax over classes or sigmoid per class.
"""

from __future__ import annotations

import torch
from torch import nn

from kafka_scorer.engine.kernels.label_scores import Backend, head_weights, label_logits, label_logprobs


def causal_label_scores(
    rows: torch.Tensor,
    lm_head: nn.Module,
    label_ids: torch.Tensor,
    label_mask: torch.Tensor,
    softmax_rows: torch.Tensor,
    *,
    need_softmax: bool,
    need_logprob: bool,
    softcap: float | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """[R, hidden] -> [R, L] float32: probabilities per label, padded columns are 0. `backend`: the
    label kernels' (`kernels/label_scores.py`)."""
    weight, bias = head_weights(lm_head)
    scores = torch.zeros(label_ids.shape, dtype=torch.float32, device=rows.device)
    if need_softmax:
        logits = label_logits(rows, weight, bias, label_ids, softcap=softcap, backend=backend)
        logits = logits.masked_fill(~label_mask, float("-inf"))
        scores = torch.where(softmax_rows[:, None], torch.softmax(logits, dim=-1), scores)
    if need_logprob:
        probs = label_logprobs(rows, weight, bias, label_ids, softcap=softcap, backend=backend).exp()
        scores = torch.where(softmax_rows[:, None], scores, probs)
    return scores.masked_fill(~label_mask, 0.0)


def classification_scores(
    rows: torch.Tensor, head: nn.Module, softmax_rows: torch.Tensor, sigmoid_rows: torch.Tensor
) -> torch.Tensor:
    """[R, hidden] -> [R, num_labels] float32 logits; per row, softmax over classes or an elementwise
    sigmoid where the job asked (SPEC §8 `activation`)."""
    logits = head(rows).float()
    scores = torch.where(softmax_rows[:, None], torch.softmax(logits, dim=-1), logits)
    return torch.where(sigmoid_rows[:, None], torch.sigmoid(logits), scores)
