"""Runs the Triton label kernels under the interpreter, in a process of its own.

Triton 3.x reads TRITON_INTERPRET when `triton` is first imported, so the variable cannot be switched
on inside the pytest process without leaking into every later test that imports triton. The parent
test saves the inputs with `torch.save`, runs this script with TRITON_INTERPRET=1, and compares what it
writes back against its own reference. This file only runs the code under test; it checks nothing.
"""

from __future__ import annotations

import sys

import torch


def main(in_path: str, out_path: str) -> None:
    from kafka_scorer.engine.kernels.label_scores import label_logits, label_logprobs
    from kafka_scorer.engine.kernels.label_scores_triton import interpreting, label_logsumexp

    assert interpreting(), "TRITON_INTERPRET=1 must be set before triton is imported"

    cases = torch.load(in_path)
    results = {}
    for name, case in cases.items():
        args = (case["hidden"], case["weight"], case["bias"], case["label_ids"])
        softcap = case["softcap"]
        if case["num_splits"] is None and case["blocks"] is None:
            results[name] = {
                "logprobs": label_logprobs(*args, backend="triton", softcap=softcap),
                "logits": label_logits(*args, backend="triton", softcap=softcap),
            }
        else:
            lse = label_logsumexp(
                *args[:3], num_splits=case["num_splits"], blocks=case["blocks"], softcap=softcap
            )
            results[name] = {"logsumexp": lse}

    # Out-of-vocabulary ids (the caller should have rejected them): the label kernel must not read
    # out of bounds; the parent checks what it returns instead.
    case = next(iter(cases.values()))
    bad = case["label_ids"].clone()
    bad[0, 0], bad[-1, -1] = -1, case["weight"].shape[0]
    results["out-of-vocab"] = {
        "label_ids": bad,
        "logits": label_logits(case["hidden"], case["weight"], case["bias"], bad, backend="triton"),
    }
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
