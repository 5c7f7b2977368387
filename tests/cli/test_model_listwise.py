"""`kafka-scorer model jina-reranker-v3 DIR` (and `jina-reranker-v3.5`) writes a checkpoint the worker
serves as the listwise kind, and the job it prints is scored as the independent reference scores it
(kafka_scorer_bench/listwise_reference.py); v3.5's config carries the windowed layer pattern."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kafka_scorer.cli.main import main
from kafka_scorer.engine.kinds.listwise import ListwiseKind
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import decode_job
from kafka_scorer_bench.listwise_reference import TOLERANCE, Reference


@pytest.mark.parametrize("name", ["jina-reranker-v3", "jina-reranker-v3.5"])
def test_the_printed_job_is_scored_as_the_reference_scores_it(tmp_path, capsys, name) -> None:
    directory = tmp_path / name
    assert main(["model", name, str(directory)]) == 0
    out = capsys.readouterr().out
    assert "--template" not in out  # the prompt is the model's own
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["JinaForRanking"]
    assert ("sliding_attention" in config.get("layer_types", [])) is name.endswith("3.5")
    line = next(text for text in out.splitlines() if text.startswith("a job:"))
    job, _ = decode_job(json.dumps(json.loads(line.split(":", 1)[1])).encode())
    scorer = Scorer(str(directory), dtype="float32", device="cpu")
    assert type(scorer.describe().kind) is ListwiseKind
    [result] = scorer.score_jobs([job])
    assert result.ok, result.error
    assert result.ranking is not None and sorted(r.index for r in result.ranking) == [0, 1]
    want = Reference(directory).scores(str(job.query), [str(item) for item in job.items or []])
    got = [row[0] for row in result.scores]
    assert np.max(np.abs(np.array(got) - np.array(want))) <= TOLERANCE
