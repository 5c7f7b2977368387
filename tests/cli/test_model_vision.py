"""`kafka-scorer model qwen3-vl-reranker DIR` writes a checkpoint the worker serves as the vision kind,
and the job it prints (a text document and an image document) is scored by it."""

from __future__ import annotations

import json

from kafka_scorer.cli.main import main
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import decode_job


def test_the_printed_image_job_is_scored(tmp_path, capsys) -> None:
    directory = tmp_path / "vl"
    assert main(["model", "qwen3-vl-reranker", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "--template qwen3-vl-reranker" in out
    line = next(text for text in out.splitlines() if text.startswith("a job:"))
    job, _ = decode_job(json.dumps(json.loads(line.split(":", 1)[1])).encode())
    scorer = Scorer(str(directory), dtype="float32", device="cpu", template="qwen3-vl-reranker")
    [result] = scorer.score_jobs([job])
    assert result.ok, result.error
    assert result.ranking is not None and sorted(r.index for r in result.ranking) == [0, 1]
