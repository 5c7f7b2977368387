"""Runs deterministic mode's span attention under triton's interpreter, in a process of its own.

TRITON_INTERPRET must be set before triton's first import, so the parent test
(test_aligned_spans_kernel.py) saves its cases with `torch.save` and runs this script with it set. This
file only runs the code under test and writes back what it computed; the parent checks it.
"""

from __future__ import annotations

import sys

import torch


def main(in_path: str, out_path: str) -> None:
    from kafka_scorer.engine.kernels.span_attention_triton import interpreting

    assert interpreting(), "TRITON_INTERPRET=1 must be set before triton is imported"
    cases = torch.load(in_path)
    engine = cases.pop("engine")
    results = {name: attend_case(case) for name, case in cases.items()}
    results["engine"] = score_deterministic(engine["model"], engine["jobs"], engine["mate"])
    torch.save(results, out_path)


def attend_case(case: dict) -> torch.Tensor:
    """The target sequence's output rows, by the mode's backend through the registry (its own tile) or,
    with `block_m` set, by the kernel over aligned (or, `merged`, the spans backend's) spans."""
    from kafka_scorer.engine.attention.layout import AttentionLayout
    from kafka_scorer.engine.attention.registry import attend, prepare_attention
    from kafka_scorer.engine.attention.spans import SpanMetadata
    from kafka_scorer.engine.kernels.span_attention_triton import span_attention

    layout = AttentionLayout(**case["layout"])
    q, k, v, scale = case["q"], case["k"], case["v"], case["scale"]
    if case["block_m"] is None:
        out = attend(q, k, v, prepare_attention(layout, "deterministic-spans"), scale, case["softcap"])
    else:
        meta = SpanMetadata.build(layout, False, block_m=case["block_m"], aligned=not case["merged"])
        ids = (meta.documents, meta.dense.segments, meta.span_offsets, meta.span_starts, meta.span_ends)
        out = span_attention(q, k, v, *ids, scale, case["softcap"], case["block_m"])
    start, length = case["target"]
    return out[:, start : start + length].clone()


def score_deterministic(model: str, jobs: list[dict], mate: dict) -> dict:
    """`jobs` on a deterministic Scorer whose attention is the span kernel (CUDA's backend, run here by
    the interpreter): each alone, then all of them reversed behind `mate`, and how many times the
    kernel ran. (tests/engine/determinism.py's 48 situations took minutes here: every program of the
    kernel is Python under the interpreter.)"""
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.wire.protocol import Job
    from tests.engine.kernel_tests.interpreter import count_span_kernel_launches

    launched = count_span_kernel_launches()
    scorer = Scorer(
        model, dtype="float32", device="cpu", deterministic=True, attention_backend="deterministic-spans"
    )
    alone = [scorer.score_jobs([Job(**job)])[0] for job in jobs]
    batched = scorer.score_jobs([Job(**mate), *(Job(**job) for job in jobs[::-1])])
    by_id = {r.id: r for r in batched}
    return {
        "alone": [r.scores for r in alone],
        "batched": [by_id[job["id"]].scores for job in jobs],
        "errors": [r.error for r in alone + batched],
        "backend": scorer.describe().attention_backend,
        "launched": launched[0],
    }


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
