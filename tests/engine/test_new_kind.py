"""A new kind is a file and a selector line (`engine/kinds/choice.py`): the bi-encoder test kind
(tests/engine/bi_encoder_kind.py) is chosen before anything loads, and scores what plain transformers
computes one sequence at a time; the Engine contract suite runs on it (tests/engine/test_engine_contract.py).
"""

from __future__ import annotations

import pytest
import torch

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.choice import KINDS, select_kind
from kafka_scorer.engine.kinds.cross_encoder import CrossEncoderKind
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.models.loaded import ModelLoadError
from kafka_scorer.engine.scoring_engine import ScoringEngine
from kafka_scorer.wire.protocol import ErrorCode, Job
from tests.engine.bi_encoder_kind import BiEncoderKind
from tests.engine.contract import run


def test_the_selector_line_chooses_the_new_kind_from_the_files_alone(bi_encoder_checkpoint, tmp_path):
    checkpoint = Checkpoint(str(bi_encoder_checkpoint))
    assert select_kind(checkpoint, (BiEncoderKind, *KINDS)) is BiEncoderKind
    assert select_kind(Checkpoint(str(bi_encoder_checkpoint))) is CrossEncoderKind  # without the line
    (tmp_path / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    with pytest.raises(ModelLoadError, match=r"BertModel.*serves only"):
        select_kind(Checkpoint(str(tmp_path)))  # read from config.json: no weights exist to load


def _reference(path: str, query: str, items: list[str]) -> list[float]:
    """Plain transformers, each text alone (no padding, its default attention), mean-pooled, cosine."""
    from transformers import AutoModel, AutoTokenizer

    model, tokenizer = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)

    def vector(text: str) -> torch.Tensor:
        with torch.no_grad():
            return model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].mean(0)

    query_vector = vector(query)
    return [float(torch.cosine_similarity(vector(item), query_vector, dim=0)) for item in items]


def test_the_new_kind_scores_as_plain_transformers_does(bi_encoder_checkpoint):
    path = str(bi_encoder_checkpoint)
    engine = ScoringEngine(EngineConfig(model=path, dtype="float32", device="cpu"), (BiEncoderKind, *KINDS))
    items = ["a short one", "a rather longer document to score", "third"]
    jobs = [Job(id="a", query="which one", items=items), Job(id="b", query="another", items=items[:2])]
    results = run(engine, jobs)
    for job, result in zip(jobs, results):
        assert result.scores is not None and result.error is None, result.error
        assert isinstance(job.items, list)
        expected = _reference(path, str(job.query), [str(item) for item in job.items])
        assert [row[0] for row in result.scores] == pytest.approx(expected, abs=1e-5)
    assert engine.served.description["kind"] == "bi-encoder"
    (refused,) = run(engine, [Job(id="d", query="q", documents=["x"])])
    assert refused.error is not None and refused.error.code is ErrorCode.UNSUPPORTED
