"""Label scores against an independent reference: one row at a time, float64, plain log_softmax.

The reference never calls the code under test; it upcasts the very same (possibly bf16/fp16) inputs to
float64, so the only differences left are the kernels' float32 accumulation and summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from kafka_scorer.engine.kernels.label_scores import (
    label_logits,
    label_logprobs,
    logsumexp_chunked,
    reference_label_logprobs,
)
from tests.engine.kernel_tests.interpreter import run_interpreted

TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float16: {"rtol": 1e-4, "atol": 1e-4},
    torch.bfloat16: {"rtol": 2e-4, "atol": 2e-4},
}


@dataclass(frozen=True)
class Case:
    rows: int
    vocab: int
    hidden: int
    dtype: torch.dtype = torch.float32
    bias: bool = True
    scale: float = 1.0  # > 1 gives logits in the hundreds: exp() overflows without the running max
    weight_dtype: torch.dtype | None = None  # mixed hidden/weight dtypes get promoted
    masked: int = 0  # bias -inf on the first `masked` ids (whole tiles and chunks); labels avoid them
    max_labels: int = 4  # label slots per row; rows use 1..max_labels of them, the rest is padding
    num_splits: int | None = None  # set: call the kernel's logsumexp directly with this layout
    blocks: tuple[int, int, int] | None = None  # (BLOCK_R, BLOCK_V, BLOCK_K)
    softcap: float | None = None  # Gemma 2's final_logit_softcapping; well below the logits' range


def make_inputs(case: Case, seed: int = 0) -> dict:
    """Random head and rows with heterogeneous label sets: 1 to max_labels per row, padded with id 0.

    With `masked`, id 0 is a -inf token, so padded slots also check that -inf passes through as -inf."""
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(case.rows, case.hidden, generator=gen) * case.scale).to(case.dtype)
    weight = (torch.randn(case.vocab, case.hidden, generator=gen) / case.hidden**0.5 * 4).to(
        case.weight_dtype or case.dtype
    )
    bias = torch.randn(case.vocab, generator=gen).to(case.dtype) if case.bias else None
    if case.masked:
        bias[: case.masked] = float("-inf")
    counts = torch.randint(1, case.max_labels + 1, (case.rows,), generator=gen)
    label_ids = torch.zeros(case.rows, case.max_labels, dtype=torch.int64)
    for r, n in enumerate(counts.tolist()):
        label_ids[r, :n] = case.masked + torch.randperm(case.vocab - case.masked, generator=gen)[:n]
    return {"hidden": hidden, "weight": weight, "bias": bias, "label_ids": label_ids, "softcap": case.softcap}


def row_reference(
    hidden, weight, bias, label_ids, softcap=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(label logits, label log-probs, log-sum-exp), float64, computed row by row; with `softcap`
    every logit is `cap · tanh(logit / cap)` first, as in transformers' Gemma 2 CausalLM."""
    logits_out, logprobs_out, lse_out = [], [], []
    w = weight.double()
    for r in range(hidden.shape[0]):
        logits = w @ hidden[r].double()
        if bias is not None:
            logits = logits + bias.double()
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        logits_out.append(logits[label_ids[r]])
        logprobs_out.append(torch.log_softmax(logits, dim=0)[label_ids[r]])
        lse_out.append(torch.logsumexp(logits, dim=0))
    return torch.stack(logits_out), torch.stack(logprobs_out), torch.stack(lse_out)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual.double(), expected, **TOLERANCE[dtype])


# ---------------------------------------------------------------- torch paths (in process)

TORCH_CASES = {
    "f32-bias": Case(rows=29, vocab=1000, hidden=72),
    "f32-nobias": Case(rows=29, vocab=1000, hidden=72, bias=False),
    "bf16-bias": Case(rows=17, vocab=515, hidden=40, dtype=torch.bfloat16),
    "f16-nobias": Case(rows=17, vocab=515, hidden=40, dtype=torch.float16, bias=False),
    "f32-large-logits": Case(rows=9, vocab=700, hidden=24, scale=60.0),
    "f32-masked-vocab": Case(rows=9, vocab=700, hidden=24, masked=300),
    "mixed-f32-hidden-bf16-head": Case(rows=9, vocab=300, hidden=24, weight_dtype=torch.bfloat16),
    "f32-softcap": Case(rows=29, vocab=1000, hidden=72, softcap=3.0),
    "bf16-softcap-nobias": Case(rows=17, vocab=515, hidden=40, dtype=torch.bfloat16, bias=False, softcap=2.0),
    "f32-softcap-masked-vocab": Case(rows=9, vocab=700, hidden=24, masked=300, softcap=3.0),
}


def test_softcap_cases_really_cap() -> None:
    """The cap bends these logits by far more than the tolerance, so ignoring it fails the tests."""
    for name, case in TORCH_CASES.items():
        if case.softcap is not None:
            inputs = make_inputs(case)
            _, capped, _ = row_reference(**inputs)
            _, uncapped, _ = row_reference(**{**inputs, "softcap": None})
            assert (capped - uncapped).abs().max() > 0.5, name


@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_label_logits_match_reference(name: str) -> None:
    case = TORCH_CASES[name]
    inputs = make_inputs(case)
    expected, _, _ = row_reference(**inputs)
    assert_matches(label_logits(**inputs), expected, case.dtype)


@pytest.mark.parametrize("name", list(TORCH_CASES))
@pytest.mark.parametrize("vocab_chunk", [64, 333, 100_000])  # many chunks, a ragged last chunk, one chunk
def test_chunked_logprobs_match_reference(name: str, vocab_chunk: int) -> None:
    case = TORCH_CASES[name]
    inputs = make_inputs(case)
    _, expected, _ = row_reference(**inputs)
    out = label_logprobs(**inputs, backend="torch", vocab_chunk=vocab_chunk)
    assert out.shape == inputs["label_ids"].shape
    assert_matches(out, expected, case.dtype)


def test_default_tiles_span_several_row_blocks_and_ragged_chunks() -> None:
    """More rows than one row block (2,048) and a vocabulary that is no multiple of the tile width."""
    case = Case(rows=2_500, vocab=3_001, hidden=16, softcap=None)
    inputs = make_inputs(case)
    _, expected, _ = row_reference(**inputs)
    assert_matches(label_logprobs(**inputs, backend="torch"), expected, case.dtype)
    peak = _peak_cpu_bytes(lambda: logsumexp_chunked(inputs["hidden"], inputs["weight"], inputs["bias"]))
    assert peak < case.rows * case.vocab * 4 / 2, "never one [rows, vocab] logits tensor"


def test_auto_backend_on_cpu_matches_reference() -> None:
    inputs = make_inputs(TORCH_CASES["f32-bias"])
    _, expected, _ = row_reference(**inputs)
    assert_matches(label_logprobs(**inputs), expected, torch.float32)


@pytest.mark.parametrize("name", ["f32-bias", "f32-softcap"])
def test_full_logits_baseline_matches_row_reference(name: str) -> None:
    """The baseline the benchmark races against must itself be right, or the race means nothing."""
    inputs = make_inputs(TORCH_CASES[name])
    _, expected, _ = row_reference(**inputs)
    assert_matches(reference_label_logprobs(**inputs), expected, torch.float32)


def test_rows_with_different_label_sets_are_independent() -> None:
    """A row's scores do not depend on which other rows share the call or how they are padded."""
    inputs = make_inputs(TORCH_CASES["f32-bias"])
    together = label_logprobs(**inputs, backend="torch")
    alone = label_logprobs(
        inputs["hidden"][3:4], inputs["weight"], inputs["bias"], inputs["label_ids"][3:4, :2], backend="torch"
    )
    torch.testing.assert_close(together[3:4, :2], alone)


def test_chunked_logsumexp_keeps_memory_to_one_chunk() -> None:
    """Peak CPU allocation while streaming stays far below one `[rows, vocab]` float32 logits tensor."""
    rows, vocab, hidden, chunk = 256, 65_536, 32, 2048
    gen = torch.Generator().manual_seed(1)
    h, w = torch.randn(rows, hidden, generator=gen), torch.randn(vocab, hidden, generator=gen)
    full_logits_bytes = rows * vocab * 4  # 64 MiB
    peak = _peak_cpu_bytes(lambda: logsumexp_chunked(h, w, None, vocab_chunk=chunk))
    baseline_peak = _peak_cpu_bytes(lambda: torch.logsumexp(h @ w.T, dim=-1))
    assert baseline_peak >= full_logits_bytes  # the probe sees the big tensor when there is one
    assert peak < full_logits_bytes / 8


def _peak_cpu_bytes(fn) -> int:
    from kafka_scorer_bench.label_kernel import peak_cpu_bytes

    return peak_cpu_bytes(fn)


def test_shape_and_backend_errors_are_named() -> None:
    inputs = make_inputs(TORCH_CASES["f32-bias"])
    with pytest.raises(ValueError, match="label_ids"):
        label_logprobs(inputs["hidden"], inputs["weight"], None, inputs["label_ids"][:3])
    with pytest.raises(ValueError, match="bias"):
        label_logits(inputs["hidden"], inputs["weight"], inputs["bias"][:5], inputs["label_ids"])
    with pytest.raises(ValueError, match="int64"):
        label_logits(inputs["hidden"], inputs["weight"], None, inputs["label_ids"].int())
    with pytest.raises(ValueError, match="backend"):
        label_logprobs(**inputs, backend="cuda-magic")  # type: ignore[arg-type]


def test_zero_rows() -> None:
    inputs = make_inputs(Case(rows=0, vocab=50, hidden=16))
    assert label_logprobs(**inputs, backend="torch").shape == (0, 4)


# ---------------------------------------------------------------- Triton kernel (interpreter)

KERNEL_CASES = {
    # through the public dispatcher, interpreter tile sizes (16 × 64 × 32): partial tiles everywhere
    "f32-bias": Case(rows=37, vocab=1000, hidden=72),
    "f32-nobias": Case(rows=37, vocab=1000, hidden=72, bias=False),
    "bf16-bias": Case(rows=21, vocab=515, hidden=40, dtype=torch.bfloat16),
    "bf16-nobias": Case(rows=21, vocab=515, hidden=40, dtype=torch.bfloat16, bias=False),
    "f16-bias": Case(rows=21, vocab=515, hidden=40, dtype=torch.float16),
    "f32-large-logits": Case(rows=9, vocab=700, hidden=24, scale=60.0),
    "f32-masked-vocab": Case(rows=9, vocab=700, hidden=24, masked=300),
    "mixed-f32-hidden-bf16-head": Case(rows=9, vocab=300, hidden=24, weight_dtype=torch.bfloat16),
    "one-row-one-label": Case(rows=1, vocab=65, hidden=16, max_labels=1),
    "three-label-slots": Case(rows=19, vocab=200, hidden=1000, max_labels=3),
    # the kernel's log-sum-exp directly, with vocabulary splits and other tilings
    "f32-3-splits": Case(rows=37, vocab=1000, hidden=72, num_splits=3),
    "f32-more-splits-than-tiles": Case(rows=37, vocab=1000, hidden=72, num_splits=40),
    "bf16-5-splits": Case(rows=21, vocab=515, hidden=40, dtype=torch.bfloat16, bias=False, num_splits=5),
    "f32-wide-tiles": Case(rows=5, vocab=257, hidden=48, num_splits=2, blocks=(32, 128, 16)),
    "f32-softcap": Case(rows=37, vocab=1000, hidden=72, softcap=3.0),
    "bf16-softcap-nobias": Case(rows=21, vocab=515, hidden=40, dtype=torch.bfloat16, bias=False, softcap=2.0),
    "f32-softcap-large-logits": Case(rows=9, vocab=700, hidden=24, scale=60.0, softcap=30.0),
    "f32-softcap-masked-vocab": Case(rows=9, vocab=700, hidden=24, masked=300, softcap=3.0),
    "f32-softcap-3-splits": Case(rows=37, vocab=1000, hidden=72, num_splits=3, softcap=3.0),
}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, torch.Tensor]]:
    """All kernel cases in one interpreter subprocess (triton + torch import once, not per case)."""
    tmp = tmp_path_factory.mktemp("label_kernel")
    payload = {}
    for name, case in KERNEL_CASES.items():
        blocks = None
        if case.blocks is not None:
            blocks = dict(zip(("BLOCK_R", "BLOCK_V", "BLOCK_K"), case.blocks, strict=True))
        payload[name] = {**make_inputs(case), "num_splits": case.num_splits, "blocks": blocks}
    return run_interpreted("_interpreted_label_kernel.py", payload, tmp)


@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_triton_kernel_matches_reference(name: str, interpreted: dict) -> None:
    case = KERNEL_CASES[name]
    inputs = make_inputs(case)
    expected_logits, expected_logprobs, expected_lse = row_reference(**inputs)
    result = interpreted[name]
    if "logprobs" in result:
        assert result["logprobs"].shape == inputs["label_ids"].shape
        assert_matches(result["logprobs"], expected_logprobs, case.dtype)
        assert_matches(result["logits"], expected_logits, case.dtype)
    else:
        assert result["logsumexp"].shape == (case.rows,)
        assert_matches(result["logsumexp"], expected_lse, case.dtype)


def test_triton_label_kernel_turns_out_of_vocab_ids_into_nan(interpreted: dict) -> None:
    """A bad id costs its own slot (nan), not an out-of-bounds read that could take the GPU down."""
    first = next(iter(KERNEL_CASES))
    inputs = make_inputs(KERNEL_CASES[first])
    result = interpreted["out-of-vocab"]
    bad = result["label_ids"]
    expected, _, _ = row_reference(**{**inputs, "label_ids": bad.clamp(0, inputs["weight"].shape[0] - 1)})
    is_bad = (bad < 0) | (bad >= inputs["weight"].shape[0])
    assert int(is_bad.sum()) == 2
    assert result["logits"][is_bad].isnan().all()
    torch.testing.assert_close(result["logits"][~is_bad].double(), expected[~is_bad], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- Triton kernel (GPU lowering, no GPU)


def _compile_for_hopper(fn, signature: dict[str, str], constexprs: dict[str, object], **options):
    """Ahead-of-time compile to sm_90 with the specialisation the JIT gives 16-divisible args."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(signature)
    aligned = [n for n in names if n.endswith("_ptr") or n.startswith("stride") or n == "H"]
    src = ASTSource(
        fn=fn,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in constexprs.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned},
    )
    return triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": True, **options}
    )


@pytest.mark.parametrize(
    ("dtype", "f32_dot", "softcap"), [("bf16", False, False), ("fp32", True, False), ("bf16", False, True)]
)
def test_lse_kernel_lowers_to_hopper_code(dtype: str, f32_dot: bool, softcap: bool) -> None:
    """The interpreter cannot catch what only the compiler rejects; lower the real kernel for an H100.

    bf16 must reach the tensor cores (wgmma) through pipelined async copies; float32 must not (its
    `ieee` dot keeps full precision instead of tf32).
    """
    from kafka_scorer.engine.kernels.label_scores_triton import _GPU_CONFIGS, _lse_partials

    config = _GPU_CONFIGS[0]
    signature = {
        **dict.fromkeys(("h_ptr", "w_ptr", "b_ptr"), f"*{dtype}"),
        "out_ptr": "*fp32",
        **dict.fromkeys(("R", "V", "H", "stride_hr", "stride_wv"), "i32"),
        "softcap": "fp32",
        "ROWS_BUCKET": "i32",
        **dict.fromkeys(("HAS_BIAS", "HAS_SOFTCAP", "F32_DOT", "BLOCK_R", "BLOCK_V", "BLOCK_K"), "constexpr"),
    }
    constexprs = {"HAS_BIAS": True, "HAS_SOFTCAP": softcap, "F32_DOT": f32_dot, **config.kwargs}
    kernel = _compile_for_hopper(
        _lse_partials, signature, constexprs, num_warps=config.num_warps, num_stages=config.num_stages
    )
    ptx = kernel.asm["ptx"]
    assert kernel.asm["cubin"]
    assert ("wgmma.mma_async" in ptx) is not f32_dot
    assert "cp.async" in ptx


def test_label_dot_kernel_lowers_to_hopper_code() -> None:
    from kafka_scorer.engine.kernels.label_scores_triton import _label_dots

    signature = {
        **dict.fromkeys(("h_ptr", "w_ptr", "b_ptr"), "*bf16"),
        "ids_ptr": "*i64",
        "out_ptr": "*fp32",
        **dict.fromkeys(("L", "V", "H", "stride_hr", "stride_wv", "stride_ir"), "i32"),
        **dict.fromkeys(("HAS_BIAS", "BLOCK_L", "BLOCK_K"), "constexpr"),
    }
    kernel = _compile_for_hopper(
        _label_dots, signature, {"HAS_BIAS": True, "BLOCK_L": 2, "BLOCK_K": 1024}, num_warps=4, num_stages=2
    )
    assert kernel.asm["cubin"]


def test_autotune_key_takes_few_row_counts() -> None:
    """The autotuner keys on the row bucket: every batch size maps to one of a handful of values (so
    tuning is bounded and can all happen at warm-up), and each bucket covers its rows."""
    from kafka_scorer.engine.kernels.label_scores_triton import rows_bucket

    buckets = {rows_bucket(rows) for rows in range(0, 20_000, 7)}
    assert len(buckets) <= 13
    assert all(rows_bucket(rows) >= rows for rows in range(1, 4097))
    assert rows_bucket(10**6) == max(buckets)


def test_interpreter_flag_without_triton_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton before 3.4 has no `triton.knobs`; the environment variable decides there."""
    import triton

    from kafka_scorer.engine.kernels import label_scores_triton as kernels

    monkeypatch.delattr(triton, "knobs", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.interpreting()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not kernels.interpreting()
