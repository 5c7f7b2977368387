"""Runs the Triton label kernel under the interpreter, in a process of its own.

Triton 3.x reads TRITON_INTERPRET when `triton` is first imported, so the variable cannot be switched
on inside the pytest process without leaking into every later test that imports triton. The parent
test saves the inputs with `torch.save`, runs this script with TRITON_INTERPRET=1, and compares what it
writes back against its own reference. This file only runs the code under test; it checks nothing.
"""

from __future__ import annotations

import sys

import torch


def main(in_path: str, out_path: str) -> None:
    import triton

    assert triton.knobs.runtime.interpret, "TRITON_INTERPRET=1 must be set before triton is imported"
    from kafka_scorer.engine.kernels.label_scores import label_logits, label_logprobs
    from kafka_scorer.engine.kernels.label_scores_triton import label_logsumexp

    results = {}
    for name, case in torch.load(in_path).items():
        if case["num_splits"] is None and case["blocks"] is None:
            args = (case["hidden"], case["weight"], case["bias"], case["label_ids"])
            results[name] = {
                "logprobs": label_logprobs(*args, backend="triton"),
                "logits": label_logits(*args, backend="triton"),
            }
        else:
            lse = label_logsumexp(
                case["hidden"],
                case["weight"],
                case["bias"],
                num_splits=case["num_splits"],
                blocks=case["blocks"],
            )
            results[name] = {"logsumexp": lse}
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
