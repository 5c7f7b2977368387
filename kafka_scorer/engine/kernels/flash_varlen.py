"""FlashAttention-2's variable-length forward, as torch ships it, and the same contract in plain torch.

The `varlen` attention backend (`engine/attention/varlen.py`) cuts a MIS batch into runs of queries,
each with its own run of keys, and hands them all to one call. On CUDA that call is aten's
`_flash_attention_forward` with cumulative run offsets: the FlashAttention-2 kernels torch builds in
(no extra package), which take grouped-query heads as they are and whose causal flag means the
*lower-right* triangle when a run has more keys than queries (torch's own `causal_lower_right` bias
relies on the same reading). The op is private; the positional part of its signature used here has
been stable since torch 2.2, and a failure at the model's shapes is the warm-up's to catch.

`reference_varlen` is the contract in plain torch, one run at a time: what the CPU, float32 and any
shape the kernel does not take run, and what the CPU tests hold the backend's run lists to. Only the
kernel itself is left to the GPU's tests (tests/cuda_tests).
"""

from __future__ import annotations

import torch

FLASH_DTYPES = (torch.float16, torch.bfloat16)


def flash_runs_on(q: torch.Tensor) -> bool:
    """Whether the kernel takes these queries: CUDA, a 16-bit dtype, a head size it is built for."""
    head = q.shape[-1]
    return q.is_cuda and q.dtype in FLASH_DTYPES and head % 8 == 0 and head <= 256


def flash_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float,
) -> torch.Tensor:
    """q [Tq, H, d], k/v [Tk, Hkv, d], int32 run offsets on the device -> [Tq, H, d]; causal within each
    run, aligned to its last key (query i of n sees keys up to i + m - n of its run's m)."""
    q, k, v = (x.contiguous() for x in (q, k, v))
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale
    )
    return out[0]


def reference_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    runs: list[tuple[int, int, int, int]],
    scale: float,
) -> torch.Tensor:
    """`flash_varlen`'s contract, one run at a time, from host-side runs `(q_start, q_end, k_start,
    k_end)` (no device sync); each run's scores in float32."""
    out = torch.zeros_like(q)
    groups = q.shape[1] // k.shape[1]
    for q_start, q_end, k_start, k_end in runs:
        n, m = q_end - q_start, k_end - k_start
        if n == 0:
            continue
        queries = q[q_start:q_end].transpose(0, 1).float()
        keys = k[k_start:k_end].transpose(0, 1).float().repeat_interleave(groups, 0)
        values = v[k_start:k_end].transpose(0, 1).float().repeat_interleave(groups, 0)
        rows = torch.arange(n, device=q.device)[:, None] + (m - n)
        allowed = torch.arange(m, device=q.device)[None, :] <= rows
        scores = (queries @ keys.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf"))
        out[q_start:q_end] = (torch.softmax(scores, -1) @ values).transpose(0, 1).to(q.dtype)
    return out
