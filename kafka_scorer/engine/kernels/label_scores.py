"""Label scores of CausalLM rows without the `[rows, vocab]` logits tensor.

A CausalLM job only ever reads a handful of logits per scoring row: those of its label tokens. The
transformers way (full logits, `log_softmax`, gather) writes and re-reads `rows × vocab` floats to get
`rows × labels` numbers. Here:

- `label_logits` gathers just the label rows of the LM head: `h · W[labels]ᵀ (+ b[labels])`. That is all
  `apply_softmax: true` needs (a softmax over the label logits).
- `label_logprobs` adds the full-vocabulary normaliser that `apply_softmax: false` needs,
  `label_logit - logsumexp_v(h · W_v + b_v)`, computed by streaming the vocabulary: a Triton kernel on
  CUDA (`label_scores_triton`), cache-sized tiles of logits in torch elsewhere. Memory stays
  `O(tile)` instead of `O(rows × vocab)`.

`softcap` (Gemma 2's `final_logit_softcapping`) replaces every logit by `cap · tanh(logit / cap)`
before anything else reads it: the label logits and each streamed chunk of the normaliser alike.
None (or 0) leaves the uncapped code untouched.

Rows carry their own label ids (`label_ids: [rows, Lmax]`), so jobs with different label sets share one
call; a caller pads short rows with any valid id and ignores those columns. Ids are not range-checked
here (that would need a device sync); the protocol layer rejects out-of-vocabulary ids first. Should
one slip through, the torch paths raise an IndexError on CPU, and the Triton kernel writes nan in that
slot rather than read out of bounds.

Every function accumulates in float32 whatever the input dtype and returns float32, and none of them
reads a device value on the host, so the engine's one sync stays the read of the final scores.
`reference_label_logprobs` is the plain transformers-style formula, kept beside the fast paths for
benchmarks and cross-checks.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Literal, TypeGuard, get_args

import torch
from torch import nn

Backend = Literal["auto", "triton", "torch", "reference"]

# The torch path's tile of float32 logits (8 MiB) and its tallest row block. The LM head's weight is
# streamed from memory once per row block, so blocks are as tall as possible; the tile stays small enough
# that the max / exp / sum passes over it hit the cache. At 4,096 rows x 151,936 vocab x 1,024 hidden
# on a 2-core Zen 3 (32 MiB L3), 2,048 x 1,024 tiles took 7.4 s where all rows x 8,192 took 9.0 s and
# 256 x 8,192 took 9.2 s (compute floor at the measured matmul peak: 6.7 s).
_TILE_ELEMENTS = 1 << 21
_MAX_ROW_BLOCK = 2048
_MAX_VOCAB_CHUNK = 8192  # few rows gain nothing from wider tiles, only a bigger transient
# Elements of float32 label-weight rows gathered at once by label_logits (64 MiB); bounds the transient
# `[rows, labels, hidden]` copy for big batches of big models.
_GATHER_BUDGET = 1 << 24


def label_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    label_ids: torch.Tensor,
    *,
    backend: Backend = "auto",
    softcap: float | None = None,
) -> torch.Tensor:
    """`[rows, Lmax]` float32 logits of each row's own labels: `h_r · W[ids_r]ᵀ + b[ids_r]`, soft-capped
    when `softcap` is set.

    `backend` as for `label_logprobs`; "triton" reads the label rows in place, "torch" gathers them in
    bounded row chunks (at most `_GATHER_BUDGET` float32 elements at a time).
    """
    _check_shapes(hidden, weight, bias, label_ids)
    backend = _resolve(backend, hidden)
    if backend == "triton":
        from kafka_scorer.engine.kernels.label_scores_triton import label_dots

        logits = label_dots(hidden, weight, bias, label_ids)
    elif backend == "reference":
        logits = hidden.float() @ weight.float().T + (bias.float() if bias is not None else 0.0)
        logits = logits.gather(1, label_ids)
    else:
        logits = _label_logits_torch(hidden, weight, bias, label_ids)
    # [rows, labels] only: capping after the dot costs nothing next to it.
    return soft_cap_(logits, softcap) if softcap else logits


def soft_cap_(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """In place `cap · tanh(logits / cap)` on a float32 tensor this module owns; returns it."""
    return logits.div_(cap).tanh_().mul_(cap)


def _label_logits_torch(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, label_ids: torch.Tensor
) -> torch.Tensor:
    rows, hidden_size = hidden.shape
    n_labels = label_ids.shape[1]
    out = torch.empty((rows, n_labels), dtype=torch.float32, device=hidden.device)
    step = max(1, _GATHER_BUDGET // max(1, n_labels * hidden_size))
    for start in range(0, rows, step):
        ids = label_ids[start : start + step]
        w = weight[ids].float()  # [r, L, H]: one copy of just the label rows
        h = hidden[start : start + step].float().unsqueeze(-1)  # [r, H, 1]
        out[start : start + step] = torch.bmm(w, h).squeeze(-1)
    if bias is not None:
        out += bias[label_ids].float()
    return out


def label_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    label_ids: torch.Tensor,
    *,
    backend: Backend = "auto",
    vocab_chunk: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """`[rows, Lmax]` float32 log-probabilities of each row's labels over the whole vocabulary (of the
    soft-capped logits when `softcap` is set).

    `backend`: "auto" (Triton on CUDA when triton is installed, chunked torch otherwise), "triton"
    (also on CPU tensors when TRITON_INTERPRET=1 was set before triton was imported), "torch" (chunked),
    "reference" (full logits; for comparisons only).
    """
    _check_shapes(hidden, weight, bias, label_ids)
    backend = _resolve(backend, hidden)
    if backend == "reference":
        return reference_label_logprobs(hidden, weight, bias, label_ids, softcap=softcap)
    if backend == "triton":
        from kafka_scorer.engine.kernels.label_scores_triton import label_logsumexp

        lse = label_logsumexp(hidden, weight, bias, softcap=softcap)
    else:
        lse = logsumexp_chunked(hidden, weight, bias, vocab_chunk=vocab_chunk, softcap=softcap)
    logits = label_logits(hidden, weight, bias, label_ids, backend=backend, softcap=softcap)
    return logits - lse.unsqueeze(-1)


def logsumexp_chunked(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    vocab_chunk: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """`logsumexp(h @ Wᵀ + b, -1)` as float32 `[rows]`, one tile of logits at a time (each tile
    soft-capped first when `softcap` is set).

    The portable twin of the Triton kernel: the same matmul, but no `[rows, vocab]` tensor, and each
    tile's log-sum-exp folded into a running one with `logaddexp`. `vocab_chunk` fixes the tile's width
    and takes all rows at once (tests use it to force ragged chunks); by default tiles are sized for the
    cache (see `_TILE_ELEMENTS`).
    """
    rows = hidden.shape[0]
    if vocab_chunk is None:
        row_block = max(1, min(rows, _MAX_ROW_BLOCK))
        vocab_chunk = min(_MAX_VOCAB_CHUNK, max(512, _TILE_ELEMENTS // row_block))
    elif vocab_chunk <= 0:
        raise ValueError(f"vocab_chunk: must be positive, got {vocab_chunk}")
    else:
        row_block = max(1, rows)
    out = torch.empty((rows,), dtype=torch.float32, device=hidden.device)
    for row in range(0, rows, row_block):
        h = hidden[row : row + row_block].float()
        out[row : row + row_block] = _running_logsumexp(h, weight, bias, vocab_chunk, softcap)
    return out


def _running_logsumexp(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, vocab_chunk: int, softcap: float | None
) -> torch.Tensor:
    running = torch.full((h.shape[0],), float("-inf"), dtype=torch.float32, device=h.device)
    for start in range(0, weight.shape[0], vocab_chunk):
        w = weight[start : start + vocab_chunk].float()
        if bias is None:
            logits = h @ w.T
        else:
            logits = torch.addmm(bias[start : start + vocab_chunk].float(), h, w.T)
        if softcap:
            soft_cap_(logits, softcap)
        # In place on the fresh tile: a third cheaper than torch.logsumexp's extra passes on CPU. The
        # clamp keeps an all -inf row at -inf instead of nan.
        peak = logits.amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(torch.float32).min)
        chunk_lse = logits.sub_(peak).exp_().sum(dim=-1).log_().add_(peak.squeeze(-1))
        running = torch.logaddexp(running, chunk_lse)
        del logits  # else the next tile is allocated while this one is still referenced: 2× the peak
    return running


def reference_label_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    label_ids: torch.Tensor,
    *,
    softcap: float | None = None,
) -> torch.Tensor:
    """The baseline the fast paths replace: full float32 logits (soft-capped as in Gemma 2's
    CausalLM when `softcap` is set), `log_softmax`, gather."""
    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return torch.log_softmax(logits, dim=-1).gather(1, label_ids)


def _resolve(backend: str, hidden: torch.Tensor) -> Backend:
    return resolve_backend(backend, hidden.device)


def resolve_backend(backend: str, device: torch.device) -> Backend:
    """The backend `backend` means for tensors on `device` ("auto": Triton on CUDA where installed)."""
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if not _is_backend(backend):
        raise ValueError(f"backend: expected auto, triton, torch or reference, got {backend!r}")
    return backend


def _is_backend(name: str) -> TypeGuard[Backend]:
    return name in get_args(Backend)


def head_weights(head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An LM head's `weight` and its `bias` (None where it has none), what the label kernels read: an
    `nn.Linear`, or any module holding those two as tensors."""
    weight = head.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"the LM head's weight is a {type(weight).__name__}, not a tensor")
    bias = getattr(head, "bias", None)
    return weight, bias if isinstance(bias, torch.Tensor) else None


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _check_shapes(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, label_ids: torch.Tensor
) -> None:
    """Shape mistakes are programming errors in the engine; name them before torch does, obscurely."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden [rows, H] and weight [vocab, H] expected, got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias [vocab={weight.shape[0]}] expected, got {tuple(bias.shape)}")
    if label_ids.dim() != 2 or label_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"label_ids [rows={hidden.shape[0]}, L] expected, got {tuple(label_ids.shape)}")
    if label_ids.dtype != torch.int64:
        raise ValueError(f"label_ids: int64 ids expected, got {label_ids.dtype}")
