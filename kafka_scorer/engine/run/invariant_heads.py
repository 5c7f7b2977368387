"""The scoring heads of deterministic mode: a row's scores whatever rows share its forward.

`engine/run/heads.py` sizes its work by the batch: the label kernels' vocabulary tiles follow the row
count, the label gather's matmul the widest label set, the softmax's sum the padded label width. Here
the rows go by blocks of `HEAD_ROWS` (the last one padded), the vocabulary's log-sum-exp by tiles of a
fixed `VOCAB_CHUNK`, a label's logit is one dot product over the hidden size, and the sum over a row's
labels runs in label order (padded labels add exact zeros). The arithmetic equals heads.py's to
rounding; the tests compare both to the independent references.
"""

from __future__ import annotations

import torch
from torch import nn

from kafka_scorer.engine.kernels.label_scores import head_weights, logsumexp_chunked, soft_cap_
from kafka_scorer.engine.layers.invariant import pad_rows, padded_length

HEAD_ROWS = 64
VOCAB_CHUNK = 4096


def invariant_label_scores(
    rows: torch.Tensor,
    lm_head: nn.Module,
    label_ids: torch.Tensor,
    label_mask: torch.Tensor,
    softmax_rows: torch.Tensor,
    *,
    need_softmax: bool,
    need_logprob: bool,
    softcap: float | None = None,
) -> torch.Tensor:
    """`heads.causal_label_scores` by fixed-shape row blocks: [R, hidden] -> [R, L] float32."""
    count = rows.shape[0]
    total = padded_length(count, HEAD_ROWS)
    padded_rows, padded_ids, padded_mask, padded_softmax = (
        pad_rows(x, total) for x in (rows, label_ids, label_mask, softmax_rows)
    )
    weight, bias = head_weights(lm_head)
    blocks = [
        _label_block(
            padded_rows[start : start + HEAD_ROWS],
            padded_ids[start : start + HEAD_ROWS],
            padded_mask[start : start + HEAD_ROWS],
            padded_softmax[start : start + HEAD_ROWS],
            weight,
            bias,
            need_softmax,
            need_logprob,
            softcap,
        )
        for start in range(0, total, HEAD_ROWS)
    ]
    return torch.cat(blocks)[:count]


def _label_block(
    rows: torch.Tensor,
    label_ids: torch.Tensor,
    label_mask: torch.Tensor,
    softmax_rows: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    need_softmax: bool,
    need_logprob: bool,
    softcap: float | None,
) -> torch.Tensor:
    hidden = rows.float()
    # one label column at a time: every reduction has HEAD_ROWS outputs, however many labels a row has
    logits = torch.stack(
        [(weight[label_ids[:, c]].float() * hidden).sum(-1) for c in range(label_ids.shape[1])], dim=1
    )
    if bias is not None:
        logits = logits + bias[label_ids].float()
    if softcap:
        soft_cap_(logits, softcap)
    scores = torch.zeros_like(logits)
    if need_softmax:
        masked = logits.masked_fill(~label_mask, float("-inf"))
        top = masked.amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
        weights = torch.exp(masked - top)
        total = weights[:, 0].clone()
        for column in range(1, weights.shape[1]):  # label order: padded labels add exact zeros
            total = total + weights[:, column]
        probs = weights / total.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
        scores = torch.where(softmax_rows[:, None], probs, scores)
    if need_logprob:
        lse = logsumexp_chunked(hidden, weight, bias, vocab_chunk=VOCAB_CHUNK, softcap=softcap)
        scores = torch.where(softmax_rows[:, None], scores, (logits - lse[:, None]).exp())
    return scores.masked_fill(~label_mask, 0.0)


def invariant_classification_scores(
    rows: torch.Tensor, head: nn.Module, softmax_rows: torch.Tensor, sigmoid_rows: torch.Tensor
) -> torch.Tensor:
    """`heads.classification_scores` by fixed-shape row blocks: [R, hidden] -> [R, classes] float32."""
    count = rows.shape[0]
    total = padded_length(count, HEAD_ROWS)
    padded = pad_rows(rows, total)
    logits = torch.cat(
        [head(padded[start : start + HEAD_ROWS]).float() for start in range(0, total, HEAD_ROWS)]
    )
    # softmax and sigmoid over the padded blocks too: on CUDA a kernel's configuration may follow the rows
    softmax, sigmoid = torch.softmax(logits, dim=-1)[:count], torch.sigmoid(logits)[:count]
    logits = logits[:count]
    scores = torch.where(softmax_rows[:, None], softmax, logits)
    return torch.where(sigmoid_rows[:, None], sigmoid, scores)
