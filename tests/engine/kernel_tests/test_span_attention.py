"""The spans backend's Triton kernel, run by triton's interpreter, against the naive float64 attention.

The reference is `naive_attention` of tests/engine/test_attention.py: SPEC §5's mask written out one
query row at a time, in float64 on the very same (possibly bfloat16) inputs, never another backend. All
cases run in one subprocess (`_interpreted_span_kernel.py`): triton reads TRITON_INTERPRET when it is
imported, and one import serves every case. The same subprocess also scores MIS jobs with a whole
Scorer whose every attention call is the kernel, checked against plain transformers one pair at a time.

Under the interpreter bfloat16 tiles are widened to float32 before each product (its bfloat16 dot is
broken, see the kernel's docstring), so the bfloat16 cases check loads, masks and the output cast, not
the GPU's bfloat16 probabilities: tests/cuda_tests/test_spans_cuda.py scores through those on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from tests.engine.kernel_tests.interpreter import run_interpreted
from tests.engine.test_attention import LAYOUTS, layout_of, naive_attention

SGLANG = [(20, (30,) * 5)]  # SGLang's benchmark shape (query 120, 10 items of 180), scaled down
TWO_JOBS = [(20, (30,) * 5), (7, (13, 0, 40)), (0, ())]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    # The output is cast to bfloat16, which the interpreter (triton 3.9) does by truncation, not to
    # nearest as the GPU does: one unit in the last place, 2**-7 of the value at most.
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-4},
}


@dataclass(frozen=True)
class Case:
    seqs: list
    heads: int = 4
    kv_heads: int = 2
    dim: int = 16
    dtype: torch.dtype = torch.float32
    softcap: float | None = None
    window: int | None = None
    block_m: int = 64  # the backend's own tile (spans.BLOCK_M); 16 crosses many tile edges
    block_n: int | None = None  # None: the kernel's chunk; 16 cuts spans into ragged chunks
    mode: str = "attend"  # attend: through the registry; kernel: the kernel with pinned blocks
    strided: bool = False  # q/k/v as the engine passes them: [T, H, d] storage, transposed views


CASES = {
    **{f"layout{i}": Case(seqs) for i, seqs in enumerate(LAYOUTS)},
    **{
        f"layout{i}-tiles16-cap": Case(seqs, softcap=1.5, block_m=16, block_n=16, mode="kernel")
        for i, seqs in enumerate(LAYOUTS)
    },
    "sglang-d64": Case(SGLANG, dim=64),
    "sglang-d64-cap": Case(SGLANG, dim=64, softcap=1.5),
    "sglang-d16-mha": Case(SGLANG, kv_heads=4),
    "sglang-d24-mqa": Case(SGLANG, kv_heads=1, dim=24),  # head dim padded to 32 by masked loads
    "sglang-d128": Case(SGLANG, heads=2, kv_heads=1, dim=128),  # Qwen3's launch shape
    "sglang-d256-cap": Case(SGLANG, heads=2, kv_heads=1, dim=256, softcap=1.5),  # Gemma 2's: 32-key chunks
    "sglang-bf16-d64": Case(SGLANG, dim=64, dtype=torch.bfloat16),
    "sglang-bf16-d16-cap": Case(SGLANG, dtype=torch.bfloat16, softcap=1.5),
    "sglang-strided": Case(SGLANG, dim=64, strided=True),
    "sglang-window-covers-all": Case(SGLANG, window=170),  # no shorter than the sequence: the kernel
    # A window shorter than a plain pair (the engine refuses MIS sequences longer than the window): the
    # dense path applies it.
    "window-short": Case([(100, ()), (20, (10, 10))], window=50),
    "two-jobs-tiles16": Case(TWO_JOBS, block_m=16, block_n=32, mode="kernel"),
    "two-jobs": Case(TWO_JOBS, softcap=1.5),
}


def make_inputs(case: Case, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    total = sum(p + sum(items) for p, items in case.seqs)

    def tensor(heads: int) -> torch.Tensor:
        if case.strided:
            return torch.randn(total, heads, case.dim, generator=gen).to(case.dtype).transpose(0, 1)
        return torch.randn(heads, total, case.dim, generator=gen).to(case.dtype)

    layout = layout_of(case.seqs)
    fields = ("seq_starts", "seq_lens", "prefix_lens", "item_lens", "sliding_window", "causal")
    return {
        "q": tensor(case.heads),
        "k": tensor(case.kv_heads),
        "v": tensor(case.kv_heads),
        "layout": {name: getattr(layout, name) for name in fields},
        # 1.5 / sqrt(d): scores of a few units, where a cap of 1.5 bends them
        "scale": 1.5 / math.sqrt(case.dim),
        **{name: getattr(case, name) for name in ("softcap", "window", "block_m", "block_n", "mode")},
    }


ENGINE_JOBS = [  # MIS jobs for a whole Scorer: tiles across the query, items and the two sequences
    {"id": "a", "query": list(range(5, 45)), "items": [list(range(50, 90)), [], list(range(7, 30))]},
    {"id": "b", "query": list(range(100, 110)), "items": [list(range(200, 260)), list(range(9, 12))]},
]
LABELS = [3, 44]


@pytest.fixture(scope="module")
def inputs() -> dict[str, dict]:
    cases = {name: make_inputs(case, seed) for seed, (name, case) in enumerate(CASES.items())}
    cases["no-keys"] = {**make_inputs(Case(SGLANG, block_m=16), 99), "mode": "no-keys"}
    return cases


@pytest.fixture(scope="module")
def interpreted(inputs: dict, tiny_models, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """All cases in one interpreter subprocess (triton + torch import once, not per case)."""
    tmp = tmp_path_factory.mktemp("span_kernel")
    jobs = [{**job, "label_token_ids": LABELS, "multi_item": True} for job in ENGINE_JOBS]
    payload = {**inputs, "engine": {"model": str(tiny_models.get()), "jobs": jobs}}
    return run_interpreted("_interpreted_span_kernel.py", payload, tmp)


def reference(case: Case, given: dict, softcap: float | None) -> torch.Tensor:
    q, k, v = given["q"], given["k"], given["v"]
    return naive_attention(q, k, v, case.seqs, given["scale"], softcap, case.window)


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_the_naive_attention(name: str, inputs: dict, interpreted: dict) -> None:
    case, given = CASES[name], inputs[name]
    got = interpreted[name]
    assert got.shape == given["q"].shape and got.dtype == case.dtype
    assert torch.isfinite(got).all()
    want = reference(case, given, case.softcap)
    torch.testing.assert_close(got.double(), want, **TOLERANCE[case.dtype])


def test_each_cap_changes_the_reference(inputs: dict) -> None:
    """The capped cases' scores are bent by far more than the tolerance: ignoring the cap fails them."""
    for name, case in CASES.items():
        if case.softcap is not None:
            given = inputs[name]
            moved = (reference(case, given, case.softcap) - reference(case, given, None)).abs().max()
            assert moved > 0.05, name


def test_rows_that_see_no_key_are_zero_not_nan(interpreted: dict) -> None:
    """Metadata listing no span for any tile: every row's running sum stays 0, and the kernel writes 0
    rather than 0/0 (real tokens always see themselves; this guards the padding rows past T)."""
    out = interpreted["no-keys"]
    assert torch.equal(out, torch.zeros_like(out))


def test_metadata_of_another_batch_is_refused(interpreted: dict) -> None:
    assert "tiles" in interpreted["mismatch"] and "tokens" in interpreted["mismatch"]


def test_a_scorer_with_the_kernel_scores_as_transformers(interpreted: dict, tiny_models) -> None:
    """The whole engine with every attention call in the kernel (under the interpreter), against plain
    transformers one pair at a time (tests/engine/reference.py), log-probabilities at 1e-4."""
    from tests.engine.reference import reference_scores

    engine = interpreted["engine"]
    assert engine["launched"] > 0 and engine["errors"] == [None] * len(ENGINE_JOBS)
    for job, scores in zip(ENGINE_JOBS, engine["scores"]):
        want = reference_scores(tiny_models.get(), job["query"], job["items"], LABELS)
        diff = max(abs(math.log(a) - math.log(b)) for ra, rb in zip(scores, want) for a, b in zip(ra, rb))
        assert diff <= 1e-4, job["id"]
