"""Deterministic mode's attention on CUDA, the span kernel over aligned spans, run by triton's interpreter.

What is proved (all cases in one interpreter subprocess, `_interpreted_aligned_spans.py`):
- a sequence's output rows are bit-identical wherever it sits: alone, behind and before generated
  batch-mates (plain pairs, MIS sequences with empty items, a sequence of prefix 0), across tile and
  chunk edges, in float32 and bfloat16, through the mode's backend (its own tile, padded rows past the
  layout as the mode pads the stream) and through the kernel with 16-row tiles;
- the same placements do change the bits of the spans backend's merged spans in float32, so they are
  placements that would catch a kernel reading another token's chunking;
- every output equals the naive float64 attention of tests/engine/test_attention.py (SPEC §5 written
  out one row at a time);
- a whole deterministic Scorer with this backend, the kernel (not the tiles) serving its layers, gives
  MIS and plain-pair jobs the same bits alone and behind a batch-mate, and scores equal to plain
  transformers one pair at a time (tests/engine/reference.py). (The 48 situations of
  tests/engine/test_deterministic.py took minutes under the interpreter; the GPU tier runs them.)

Whether a GPU's tensor cores keep a row's result independent of its place in the tile, the one thing
the interpreter cannot show, is tests/cuda_tests/test_deterministic_cuda.py's on a GPU.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.engine.kernel_tests.interpreter import run_interpreted
from tests.engine.test_attention import layout_of, naive_attention

TARGETS = {
    "sglang": (20, (30,) * 5),  # SGLang's benchmark shape, scaled down
    "empty-item": (7, (13, 0, 40)),
    "no-prefix": (0, (20, 21)),
    "pair": (50, ()),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
PLACEMENTS = 4
HEADS, KV_HEADS, DIM = 2, 1, 32
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-4},  # the interpreter's bfloat16 cast truncates
}
LABELS = [3, 44]
ENGINE_JOBS = [  # MIS and plain pairs, softmax and log-probabilities; items that cross 64-row tiles
    {
        "id": "a",
        "query": list(range(5, 45)),
        "items": [list(range(50, 80)), list(range(7, 32)), list(range(90, 140))],
    },
    {
        "id": "b",
        "query": list(range(100, 110)),
        "items": [list(range(200, 270)), [9, 10, 11]],
        "apply_softmax": True,
    },
    {
        "id": "c",
        "query": list(range(60, 93)),
        "items": [list(range(1, 20)), list(range(30, 45))],
        "multi_item": False,
    },
]
ENGINE_JOBS = [{"label_token_ids": LABELS, **job} for job in ENGINE_JOBS]
MATE = {"id": "mate", "query": list(range(11, 44)), "items": [list(range(120, 184)), list(range(3, 20))]}
MATE["label_token_ids"] = LABELS
PADDING = 37
"""Rows past the layout in the backend's cases: the mode pads the stream to whole row blocks."""


def mates(rng: random.Random) -> list[tuple[int, tuple[int, ...]]]:
    """0-2 generated sequences: plain pairs or MIS with empty items, lengths that cross tiles."""
    return [
        (rng.randint(0, 40), tuple(rng.choice([0, 1, 9, 33, 50]) for _ in range(rng.randint(0, 3))))
        for _ in range(rng.randint(0, 2))
    ]


def placements(target) -> list[tuple[list, list]]:
    rng = random.Random(repr(target))
    return [([], [])] + [(mates(rng), mates(rng)) for _ in range(PLACEMENTS - 1)]


def case(target, before, after, dtype, block_m, merged: bool, seed: int) -> dict:
    """Random q/k/v of the whole stream, the target's own rows drawn from its own seed (the same values
    in every placement)."""
    seqs = [*before, target, *after]
    layout = layout_of(seqs)
    start = sum(p + sum(items) for p, items in before)
    length = target[0] + sum(target[1])
    extra = PADDING if block_m is None else 0
    noise, own = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(len(repr(target)))
    tensors = {}
    for name, heads in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
        full = torch.randn(heads, layout.total_tokens + extra, DIM, generator=noise)
        full[:, start : start + length] = torch.randn(heads, length, DIM, generator=own)
        tensors[name] = full.to(dtype)
    fields = ("seq_starts", "seq_lens", "prefix_lens", "item_lens", "sliding_window", "causal")
    return {
        **tensors,
        "layout": {f: getattr(layout, f) for f in fields},
        "scale": 1.5 / math.sqrt(DIM),
        "softcap": None,
        "block_m": block_m,
        "merged": merged,
        "target": (start, length),
        "seqs": seqs,
    }


def cases() -> dict[str, dict]:
    out, seed = {}, 0
    for target_name, target in TARGETS.items():
        for dtype_name, dtype in DTYPES.items():
            for tiles, block_m, merged in (("mode", None, False), ("t16", 16, False), ("merged", 16, True)):
                if block_m is not None and dtype is not torch.float32:
                    continue  # bfloat16 through the mode's own tile only
                for n, (before, after) in enumerate(placements(target)):
                    seed += 1
                    name = f"{target_name}/{dtype_name}/{tiles}/{n}"
                    out[name] = case(target, before, after, dtype, block_m, merged, seed)
    return out


@pytest.fixture(scope="module")
def inputs() -> dict[str, dict]:
    return cases()


@pytest.fixture(scope="module")
def interpreted(inputs: dict, tiny_models, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("aligned_spans")
    payload = {name: {k: v for k, v in c.items() if k != "seqs"} for name, c in inputs.items()}
    payload["engine"] = {"model": str(tiny_models.get()), "jobs": ENGINE_JOBS, "mate": MATE}
    return run_interpreted("_interpreted_aligned_spans.py", payload, tmp)


def groups(inputs: dict, tiles: str) -> dict[tuple[str, str], list[str]]:
    """(target, dtype) -> the names of its placements run with `tiles`."""
    out: dict[tuple[str, str], list[str]] = {}
    for name in inputs:
        target, dtype, kind, _ = name.split("/")
        if kind == tiles:
            out.setdefault((target, dtype), []).append(name)
    return out


@pytest.mark.parametrize("tiles", ["mode", "t16"])
def test_a_sequence_s_rows_are_bit_identical_wherever_it_sits(inputs, interpreted, tiles) -> None:
    for key, names in groups(inputs, tiles).items():
        alone = interpreted[names[0]]
        differing = [n for n in names[1:] if not torch.equal(interpreted[n], alone)]
        assert not differing, (key, differing)


def test_merged_spans_change_bits_in_the_same_placements(inputs, interpreted) -> None:
    """The control: the spans backend's merged ranges are chunked from another run's first token in some
    of these placements, and there the bits move."""
    moved = 0
    for names in groups(inputs, "merged").values():
        alone = interpreted[names[0]]
        moved += sum(not torch.equal(interpreted[n], alone) for n in names[1:])
    assert moved > 0


def test_every_output_equals_the_naive_attention(inputs, interpreted) -> None:
    for name, given in inputs.items():
        start, length = given["target"]
        want = naive_attention(given["q"], given["k"], given["v"], given["seqs"], given["scale"])
        got = interpreted[name]
        assert got.dtype == given["q"].dtype and torch.isfinite(got).all(), name
        torch.testing.assert_close(got.double(), want[:, start : start + length], **TOLERANCE[got.dtype])


def test_a_deterministic_scorer_on_the_kernel_keeps_every_job_s_bits_and_scores_as_transformers(
    interpreted, tiny_models
) -> None:
    from tests.engine.reference import reference_scores

    engine = interpreted["engine"]
    assert engine["backend"] == "deterministic-spans" and engine["launched"] > 0
    assert not any(engine["errors"])
    for job, alone, batched in zip(ENGINE_JOBS, engine["alone"], engine["batched"], strict=True):
        assert batched == alone, job["id"]
        want = reference_scores(
            tiny_models.get(),
            job["query"],
            job["items"],
            LABELS,
            apply_softmax=job.get("apply_softmax", False),
        )
        diff = max(abs(a - b) for ra, rb in zip(alone, want) for a, b in zip(ra, rb))
        assert diff <= 1e-4, job["id"]
