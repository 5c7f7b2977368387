"""Runs the warm-up's label-kernel step under the interpreter, in a process of its own.

The parent saves a tiny CausalLM's path and a job's text (log-probabilities, no softmax); this script
serves the model with the Triton label kernels (on CPU tensors under TRITON_INTERPRET=1), runs the
warm-up, counts the kernel launches, scores the job, then warms up a second scorer whose dots kernel
fails at four labels. It saves what it saw; the parent checks it. This file only runs the code under
test.
"""

from __future__ import annotations

import logging
import sys

import torch


def main(in_path: str, out_path: str) -> None:
    import kafka_scorer.engine.kernels.label_scores_triton as kernels
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.wire.protocol import Job

    case = torch.load(in_path)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("kafka_scorer").addHandler(handler)
    logging.getLogger("kafka_scorer").setLevel(logging.INFO)

    launches = {"lse": [], "dots": []}
    lse, dots = kernels.label_logsumexp, kernels.label_dots
    kernels.label_logsumexp = lambda hidden, *a, **k: (
        launches["lse"].append(hidden.shape[0]) or lse(hidden, *a, **k)
    )
    kernels.label_dots = lambda hidden, w, b, ids: (
        launches["dots"].append(ids.shape[1]) or dots(hidden, w, b, ids)
    )

    def serve() -> Scorer:
        scorer = Scorer(
            case["path"], dtype="float32", device="cpu", max_batch_tokens=64, max_labels_per_job=4
        )
        scorer.describe().runner.label_backend = "triton"
        return scorer

    scorer = serve()
    scorer.engine.warm_up()
    job = Job(id="j", query=case["query"], items=case["items"], label_token_ids=case["labels"])
    result = scorer.score_jobs([job])[0]
    saw = {
        "launches": {k: list(v) for k, v in launches.items()},
        "backend": scorer.describe().runner.label_kernels,
    }

    def broken(hidden, w, b, ids):  # the warm-up's batches (one label) pass; a wider tile fails
        if ids.shape[1] >= 4:
            raise RuntimeError("out of resources: shared memory, required: 263168, hardware limit: 232448")
        return dots(hidden, w, b, ids)

    kernels.label_dots = broken
    failing = serve()
    del records[:]
    failing.engine.warm_up()
    torch.save(
        {
            **saw,
            "scores": result.scores,
            "error": None if result.error is None else str(result.error),
            "failed_backend": failing.describe().runner.label_kernels,
            "failed_lines": list(records),
        },
        out_path,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
