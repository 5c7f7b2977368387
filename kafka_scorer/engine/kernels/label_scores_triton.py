"""Label scores in Triton: full-vocabulary log-sum-exp of `h · Wᵀ + b` without `[rows, vocab]` logits,
and each row's own label logits.

`apply_softmax: false` needs `logprob = label_logit - logsumexp_v(h · W_v + b_v)`. The label logits are
cheap (`label_dots`: one program per row reads just its label rows of W); the normaliser is the
expensive part (`label_logsumexp`), a matmul as large as the LM head itself. Materialising it as logits
costs `rows × vocab × 4` bytes (2.5 GB at 4,096 rows and a 151,936 vocabulary) plus two more full
passes over it for the upcast and `log_softmax`. Here each program owns a block of rows and a
contiguous slice of the vocabulary, computes one `[BLOCK_R, BLOCK_V]` logits tile at a time in
registers with `tl.dot` over hidden chunks, and folds it into a running max and sum-exp (online
log-sum-exp). Only `[splits, rows]` partial results reach memory; a `torch.logsumexp` over the splits
finishes the job on the device, with no host sync.

A soft-capped head (Gemma 2's `final_logit_softcapping`) caps each tile in registers before it is
folded in; `HAS_SOFTCAP` is a constexpr, so the uncapped kernel compiles exactly as before.

Vocabulary splits exist so that a small batch still fills the GPU: with few row blocks, the grid's
second axis gives every SM a slice of the vocabulary.

With `TRITON_INTERPRET=1` the same kernel body runs on CPU tensors, which is how the tests check it
against the torch reference without a GPU. Triton 3.x reads that variable when `triton` itself is
imported (its standard library, `tl.max`, `tl.cdiv`..., is jit-decorated then), so it must be set before
the first `import triton` in the process; setting it later gives "Cannot call @triton.jit'd outside of
the scope of a kernel". The tests therefore run the kernel in a fresh subprocess.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import triton
import triton.language as tl

from kafka_scorer.engine.kernels.runs_on import interpreter_asked

# Interpreter tiles: tl.dot needs every dimension >= 16; small tiles keep the Python-level grid short
# and still exercise partial row, vocabulary and hidden tiles in tests.
_INTERPRET_BLOCKS = {"BLOCK_R": 16, "BLOCK_V": 64, "BLOCK_K": 32}

# GPU candidates: large row tiles give each loaded weight tile more reuse (the kernel is the LM head
# matmul, so arithmetic intensity is what matters); the 64-row ones serve small batches.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_R": 128, "BLOCK_V": 128, "BLOCK_K": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_R": 128, "BLOCK_V": 256, "BLOCK_K": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_R": 128, "BLOCK_V": 128, "BLOCK_K": 32}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_R": 64, "BLOCK_V": 128, "BLOCK_K": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_R": 64, "BLOCK_V": 256, "BLOCK_K": 64}, num_warps=8, num_stages=3),
]

# Fused multiply-add on, said explicitly: triton 3.9 warns that its unset default flips in 3.10.
_OPTIONS = {"enable_fp_fusion": True}

# A vocabulary split below this many columns costs more in partial results than it gains in occupancy.
_MIN_SPLIT_COLUMNS = 2048


# Not specialised on the row count (nor its bucket, which no line reads): Triton compiles a kernel
# apart for an integer argument equal to 1 or divisible by 16, so each batch's row count would pick one
# of three binaries per tile configuration, compiled at its first sight, in service.
@triton.jit(do_not_specialize=["R", "ROWS_BUCKET"])
def _lse_partials(
    h_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    R,
    V,
    H,
    stride_hr,
    stride_wv,
    softcap,
    ROWS_BUCKET,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    F32_DOT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One program: rows [pid_r·BLOCK_R, +BLOCK_R) × its share of vocabulary tiles → partial LSE per row.

    `ROWS_BUCKET` is not read: it is the row count rounded up to a power of two, there only so that the
    autotuner keys on it (the best tile for 64 rows is not the best for 4,096).
    """
    pid_r = tl.program_id(0)
    pid_s = tl.program_id(1)
    n_splits = tl.num_programs(1)

    # Scalar int64 bases, int32 per-element offsets: vocab × hidden passes 2**31 for large heads (256k ×
    # 8192), but one tile never does, and int64 pointer tensors cost registers the matmul needs.
    r0 = pid_r * BLOCK_R
    offs_r = tl.arange(0, BLOCK_R)
    offs_v = tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = r0 + offs_r < R
    h_block = h_ptr + r0.to(tl.int64) * stride_hr
    a_offs = offs_r[:, None] * stride_hr + offs_k[None, :]
    b_offs = offs_v[None, :] * stride_wv + offs_k[:, None]

    n_tiles = tl.cdiv(V, BLOCK_V)
    tiles_per_split = tl.cdiv(n_tiles, n_splits)
    first = pid_s * tiles_per_split
    last = tl.minimum(first + tiles_per_split, n_tiles)

    run_max = tl.full([BLOCK_R], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_R], tl.float32)
    for tile in range(first, last):
        c0 = tile * BLOCK_V
        col_ok = c0 + offs_v < V
        w_block = w_ptr + c0.to(tl.int64) * stride_wv
        acc = tl.zeros([BLOCK_R, BLOCK_V], tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k_ok = k0 + offs_k < H
            a = tl.load(h_block + k0 + a_offs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w_block + k0 + b_offs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            if F32_DOT:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        if HAS_BIAS:
            bias = tl.load(b_ptr + c0 + offs_v, mask=col_ok, other=0.0).to(tl.float32)
            acc = acc + bias[None, :]
        if HAS_SOFTCAP:
            acc = _soft_cap(acc, softcap)
        acc = tl.where(col_ok[None, :], acc, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(acc, axis=1))
        # Shift by 0 while a row has seen only -inf (a -inf bias masking whole tiles): -inf - -inf is nan.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(acc - shift[:, None]), axis=1)
        run_max = new_max

    # Once a finite logit is seen run_sum >= 1 (the max term is exp(0)), so the clamp only touches rows
    # that saw nothing finite, or splits with no tiles: they report -inf, the identity of log-sum-exp,
    # without evaluating log(0).
    partial = run_max + tl.log(tl.maximum(run_sum, 1.0))
    tl.store(out_ptr + pid_s * R + r0 + offs_r, partial, mask=row_ok)


@triton.jit
def _soft_cap(x, cap):
    """`cap · tanh(x / cap)` from one exp (triton.language has no tanh; libdevice's does not run under
    the interpreter). exp(-2|y|) <= 1 never overflows, and -inf maps to -cap as torch.tanh gives."""
    y = x / cap
    e = tl.exp(-2.0 * tl.abs(y))
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(y < 0, -t, t)


@triton.jit(do_not_specialize=["L"])  # the label count: the tile (BLOCK_L) already covers it
def _label_dots(
    h_ptr,
    w_ptr,
    b_ptr,
    ids_ptr,
    out_ptr,
    L,
    V,
    H,
    stride_hr,
    stride_wv,
    stride_ir,
    HAS_BIAS: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One program per row: the row's own label logits, reading only those rows of the weight.

    An id outside [0, V) yields nan instead of a read out of bounds: on CUDA that read could kill the
    context and the worker with it, while a nan score is visible and harms only its own row.
    """
    r = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, BLOCK_L)
    ids = tl.load(ids_ptr + r * stride_ir + slots, mask=slots < L, other=0).to(tl.int64)
    id_ok = (ids >= 0) & (ids < V)
    slot_ok = (slots < L) & id_ok
    acc = tl.zeros([BLOCK_L], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < H
        h = tl.load(h_ptr + r * stride_hr + ks, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(
            w_ptr + ids[:, None] * stride_wv + ks[None, :], mask=slot_ok[:, None] & k_ok[None, :], other=0.0
        ).to(tl.float32)
        acc += tl.sum(w * h[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + ids, mask=slot_ok, other=0.0).to(tl.float32)
    acc = tl.where(id_ok, acc, float("nan"))
    tl.store(out_ptr + r * L + slots, acc, mask=slots < L)


# Under the interpreter autotuning would time Python loops and multiply test time for nothing, so the
# plain kernel is launched with _INTERPRET_BLOCKS instead.
_lse_partials_tuned = triton.autotune(
    configs=_GPU_CONFIGS, key=["ROWS_BUCKET", "V", "H", "HAS_BIAS", "HAS_SOFTCAP", "F32_DOT"]
)(_lse_partials)

# Row counts are bucketed for the autotune key: powers of two up to this, then this (4,096 rows already
# fill every SM with 128-row tiles, so larger batches tune the same way).
_MAX_ROWS_BUCKET = 4096


def rows_bucket(rows: int) -> int:
    """The autotune key's row count: a handful of distinct values, so tuning happens a bounded number
    of times (all at warm-up: `warm_label_kernels`) instead of once per batch size."""
    return min(triton.next_power_of_2(max(rows, 1)), _MAX_ROWS_BUCKET)


def interpreting() -> bool:
    """Whether triton runs kernels in its CPU interpreter. `triton.knobs` exists from Triton 3.4; older
    releases (which CUDA builds of torch 2.5–2.7 bring) read the environment variable directly."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return interpreter_asked()


@contextlib.contextmanager
def _on_device(t: torch.Tensor) -> Iterator[None]:
    """Launch on the tensor's own GPU: triton launches on the thread's current device, so with
    `device=cuda:1` a bare launch would run on GPU 0 with GPU 1 pointers."""
    if t.device.type == "cuda":
        with torch.cuda.device(t.device):
            yield
    else:
        yield


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_splits(rows: int, vocab: int, device: torch.device) -> int:
    """Enough programs for about two waves on the GPU, never a split narrower than _MIN_SPLIT_COLUMNS."""
    if device.type != "cuda":
        return 1
    row_blocks = triton.cdiv(max(rows, 1), 128)
    wanted = triton.cdiv(2 * _sm_count(device), row_blocks)
    return max(1, min(wanted, triton.cdiv(vocab, _MIN_SPLIT_COLUMNS)))


def label_logsumexp(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    num_splits: int | None = None,
    blocks: dict[str, int] | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """`logsumexp(hidden @ weight.T + bias, -1)` as float32 `[rows]`, streaming vocabulary tiles; each
    logit soft-capped first when `softcap` is set (None or 0: off).

    `blocks` pins BLOCK_R/BLOCK_V/BLOCK_K (skipping autotune); tests use it with `num_splits` to cover
    several tile and split layouts.
    """
    rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    if rows == 0:
        return torch.empty(0, dtype=torch.float32, device=hidden.device)
    # tl.dot needs one operand dtype; mixed inputs are promoted rather than silently rounded down.
    dtype = torch.promote_types(hidden.dtype, weight.dtype)
    h = _unit_stride(hidden.to(dtype))
    w = _unit_stride(weight.to(dtype))
    b = bias.contiguous() if bias is not None else h  # any pointer will do when HAS_BIAS is off
    splits = num_splits or default_splits(rows, vocab, hidden.device)
    partials = torch.empty((splits, rows), dtype=torch.float32, device=hidden.device)

    _require_device(hidden)
    interpret = interpreting()
    args = (
        *(h, w, b, partials, rows, vocab, hidden_size, h.stride(0), w.stride(0)),
        *(float(softcap or 1.0), rows_bucket(rows)),
    )
    # float32 must not drop to tf32. The interpreter (triton 3.9) multiplies bfloat16 tiles as their raw
    # uint16 bits, so there they are widened first: bf16 × bf16 products are exact in float32 either way.
    f32_dot = dtype == torch.float32 or (interpret and dtype == torch.bfloat16)
    flags = {"HAS_BIAS": bias is not None, "HAS_SOFTCAP": bool(softcap), "F32_DOT": f32_dot}
    with _on_device(hidden):
        if interpret or blocks is not None:
            meta = blocks or _INTERPRET_BLOCKS
            grid = (triton.cdiv(rows, meta["BLOCK_R"]), splits)
            _lse_partials[grid](*args, **flags, **meta, **_OPTIONS)
        else:
            _lse_partials_tuned[_grid(rows, splits)](*args, **flags, **_OPTIONS)
    return torch.logsumexp(partials, dim=0) if splits > 1 else partials[0]


def label_dots(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, label_ids: torch.Tensor
) -> torch.Tensor:
    """`[rows, L]` float32 `h_r · W[ids_r] + b[ids_r]`, with no `[rows, L, hidden]` gathered copy."""
    rows, n_labels = label_ids.shape
    out = torch.empty((rows, n_labels), dtype=torch.float32, device=hidden.device)
    if rows == 0 or n_labels == 0:
        return out
    _require_device(hidden)
    h = _unit_stride(hidden)
    w = _unit_stride(weight)
    ids = _unit_stride(label_ids)
    block_l, block_k = dots_tiles(n_labels, hidden.shape[1])
    with _on_device(hidden):
        _label_dots[(rows,)](
            h,
            w,
            bias.contiguous() if bias is not None else h,
            ids,
            out,
            n_labels,
            weight.shape[0],
            hidden.shape[1],
            h.stride(0),
            w.stride(0),
            ids.stride(0),
            HAS_BIAS=bias is not None,
            BLOCK_L=block_l,
            BLOCK_K=block_k,
            **_OPTIONS,
        )
    return out


def dots_tiles(labels: int, hidden_size: int) -> tuple[int, int]:
    """(BLOCK_L, BLOCK_K) of the label dots for `labels` labels per row: about 4k weight elements in
    flight per step, enough to hide latency, few enough registers."""
    block_l = triton.next_power_of_2(labels)
    return block_l, max(16, min(1024, triton.next_power_of_2(hidden_size), 4096 // block_l))


def _require_device(t: torch.Tensor, kernels: str = "Triton label kernels") -> None:
    """The one check every Triton kernel of this package makes before a launch: CUDA tensors, or the
    interpreter on."""
    if t.device.type != "cuda" and not interpreting():
        raise RuntimeError(f"{kernels} need CUDA tensors, or TRITON_INTERPRET=1 before importing triton")


def _grid(rows: int, splits: int) -> Callable[[dict[str, Any]], tuple[int, int]]:
    return lambda meta: (triton.cdiv(rows, meta["BLOCK_R"]), splits)


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    """The kernel walks the hidden dimension with stride 1; anything else gets one contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def warm_label_kernels(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    softcap: float | None,
    max_rows: int,
    max_labels: int,
) -> tuple[list[int], list[int]]:
    """Tune and compile, before traffic, every launch shape traffic can bring: the log-sum-exp's autotune
    key at each row bucket up to `max_rows` scoring rows per forward, and the label dots at each tile of
    up to `max_labels` labels. Otherwise each new bucket autotunes (every candidate compiled and timed)
    and each new label tile compiles on a live batch: seconds of one forward's latency, in service.
    Returns the row buckets and label tiles, in order."""
    buckets = _powers_of_two(rows_bucket(max_rows))
    tiles = _powers_of_two(triton.next_power_of_2(max(1, max_labels)))
    hidden_size = weight.shape[1]
    for rows in buckets:
        hidden = torch.zeros((rows, hidden_size), dtype=weight.dtype, device=weight.device)
        label_logsumexp(hidden, weight, bias, softcap=softcap)
    one_row = torch.zeros((1, hidden_size), dtype=weight.dtype, device=weight.device)
    for labels in tiles:
        label_dots(one_row, weight, bias, torch.zeros((1, labels), dtype=torch.long, device=weight.device))
    if weight.device.type == "cuda":
        torch.cuda.synchronize(weight.device)
    return buckets, tiles


def _powers_of_two(largest: int) -> list[int]:
    return [1 << exponent for exponent in range(largest.bit_length())]
