"""Runs the spans backend's Triton kernel under the interpreter, in a process of its own.

Triton 3.x reads TRITON_INTERPRET when `triton` is first imported, so the variable cannot be switched
on inside the pytest process. The parent test saves the inputs with `torch.save`, runs this script with
TRITON_INTERPRET=1, and compares what it writes back against the naive float64 attention of
tests/engine/test_attention.py. This file only runs the code under test; it checks nothing but that the
kernel (not the dense fallback) is what runs.
"""

from __future__ import annotations

import sys

import torch


def main(in_path: str, out_path: str) -> None:
    from kafka_scorer.engine.attention.layout import AttentionLayout
    from kafka_scorer.engine.attention.registry import attend
    from kafka_scorer.engine.attention.spans import SpanMetadata
    from kafka_scorer.engine.kernels.runs_on import triton_runs_on as kernel_runs_on
    from kafka_scorer.engine.kernels.span_attention_triton import interpreting, span_attention

    assert interpreting(), "TRITON_INTERPRET=1 must be set before triton is imported"
    assert kernel_runs_on(torch.device("cpu")), "the spans backend would take the dense path"

    results = {}
    cases = torch.load(in_path)
    engine = cases.pop("engine")
    results["engine"] = score_with_the_kernel(engine["model"], engine["jobs"])
    for name, case in cases.items():
        layout = AttentionLayout(**case["layout"])
        metadata = SpanMetadata.build(layout, pin=False, block_m=case["block_m"])
        q, k, v, scale, softcap = case["q"], case["k"], case["v"], case["scale"], case["softcap"]
        if case["mode"] == "attend":  # the backend as the registry dispatches it
            results[name] = attend(q, k, v, metadata, scale, softcap, case["window"])
            continue
        offsets = metadata.span_offsets
        if case["mode"] == "no-keys":  # every tile lists no span: rows that see nothing
            offsets = torch.zeros_like(offsets)
        results[name] = span_attention(
            *(q, k, v, metadata.documents, metadata.dense.segments, offsets),
            *(metadata.span_starts, metadata.span_ends, scale, softcap, case["block_m"]),
            block_n=case["block_n"],
        )

    # Metadata built for another batch: a clear error, not a read past the tiles.
    case = next(iter(cases.values()))
    try:
        span_attention(
            case["q"], case["k"], case["v"], *[torch.zeros(1, dtype=torch.int32)] * 5, 1.0, None, 16
        )
    except ValueError as exc:
        results["mismatch"] = str(exc)
    torch.save(results, out_path)


def score_with_the_kernel(model: str, jobs: list[dict]) -> dict:
    """A whole Scorer with attention_backend="spans" on the CPU: under the interpreter every layer's
    attention is the kernel, fed as the engine feeds it (the fused decoder's transposed q/k/v, the
    metadata the packing thread built). Returns the scores and how many times the kernel ran."""
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.wire.protocol import Job
    from tests.engine.kernel_tests.interpreter import count_span_kernel_launches

    launched = count_span_kernel_launches()
    scorer = Scorer(model, dtype="float32", device="cpu", attention_backend="spans", prefix_cache_mb=0)
    results = scorer.score_jobs([Job(**job) for job in jobs])
    scores, errors = [r.scores for r in results], [r.error for r in results]
    return {"scores": scores, "errors": errors, "launched": launched[0]}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
