"""Run by test_warm_up.py in a process of its own: a Scorer with compiled decoder layers warmed up where
inductor finds no C++ compiler; prints what the warm-up said and a job's scores as one JSON line."""

from __future__ import annotations

import json
import logging
import sys

import torch._inductor.config as inductor

from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Job


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main(path: str) -> None:
    inductor.cpp.cxx = ("/nonexistent/c++",)
    lines = _Lines()
    logging.getLogger("kafka_scorer.engine.load.warm_up_fallbacks").addHandler(lines)
    logging.getLogger("kafka_scorer.engine.load.warm_up").addHandler(lines)
    scorer = Scorer(path, dtype="float32", device="cpu", decoder_forward="compiled", max_batch_tokens=512)
    assert scorer.describe().loaded.body.regions.compiled
    scorer.engine.warm_up()
    job = Job(id="j", query=[5, 6, 7, 8], items=[[9, 10], [11]], label_token_ids=[1, 2], multi_item=True)
    result = scorer.score_jobs([job])[0]
    report = {
        "compiled_after": scorer.describe().loaded.body.regions.compiled,
        "warnings": lines.lines,
        "scores": result.scores,
        "error": result.error.message if result.error else None,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
