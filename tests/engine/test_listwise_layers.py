"""jina-reranker-v3.5's layer pattern through the listwise kind: sliding-window layers beside global ones.

transformers' `Qwen3Config` says per layer which attention it runs (`layer_types`: `sliding_attention`
or `full_attention`) and how wide the window is (`sliding_window`, kept only with `use_sliding_window`
true); vLLM's Qwen3 reads the same fields (vllm-project/vllm PR 39515). The tiny checkpoint here has
that pattern with a 24-token window, far shorter than any prompt, so a forward that ignored the layer
types would be far off. The reference (kafka_scorer_bench/listwise_reference.py) is a plain transformers
`Qwen3Model` forward, one prompt at a time, which honours the layer types itself.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kafka_scorer.engine.models.loaded import ModelLoadError
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.listwise_reference import TOLERANCE, Reference

WINDOW = 24
QUERIES = ["what is green tea good for?", "Kafka consumer groups"]
DOCS = [
    ["Green tea has catechins.", "Coffee prices rose.", "Tea may help the brain.", "Basketball is popular."],
    ["A consumer group shares partitions.", "Rebalancing moves partitions between members."],
]


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    from kafka_scorer.checkpoints.tiny_listwise import V35_LAYERS, build_tiny_listwise

    path = tmp_path_factory.mktemp("listwise-v35")
    return build_tiny_listwise(
        path, num_layers=len(V35_LAYERS), layer_types=V35_LAYERS, sliding_window=WINDOW
    )


@pytest.fixture(scope="module")
def scorer(windowed) -> Scorer:
    return Scorer(str(windowed), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def reference(windowed) -> Reference:
    return Reference(windowed)


def column(result) -> list[float]:
    assert result.error is None, result.error
    return [row[0] for row in result.scores]


def gap(got: list[float], want: list[float]) -> float:
    assert len(got) == len(want)
    return float(np.max(np.abs(np.array(got) - np.array(want))))


def test_the_checkpoint_has_the_v35_pattern(windowed, scorer):
    config = json.loads((windowed / "config.json").read_text())
    assert "sliding_attention" in config["layer_types"] and "full_attention" in config["layer_types"]
    assert config["sliding_window"] == WINDOW and config["use_sliding_window"] is True
    assert scorer.describe().loaded.body.config.layer_types == config["layer_types"]


def test_each_job_alone_equals_the_reference(scorer, reference):
    for query, docs in zip(QUERIES, DOCS):
        [result] = scorer.score_jobs([Job(id="a", query=query, items=docs)])
        assert gap(column(result), reference.scores(query, docs)) <= TOLERANCE


def test_jobs_of_different_lengths_batched_equal_the_reference(scorer, reference):
    """Right-padded side by side: each prompt's window counts from its own first token."""
    jobs = [Job(id=str(i), query=q, items=d) for i, (q, d) in enumerate(zip(QUERIES, DOCS))]
    jobs.append(Job(id="single", query=QUERIES[0], items=DOCS[0], multi_item=False))
    for job, result in zip(jobs, scorer.score_jobs(jobs)):
        items = [str(item) for item in job.items or []]
        if job.multi_item is False:
            want = [reference.scores(str(job.query), [item])[0] for item in items]
        else:
            want = reference.scores(str(job.query), items)
        assert gap(column(result), want) <= TOLERANCE, job.id


def test_the_window_changes_the_scores(windowed, scorer, reference):
    """The same weights with every layer global score far from the windowed reference: a forward
    that ignored `layer_types` could not pass the tests above."""
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config.from_pretrained(windowed)
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    glob = Reference(windowed)
    glob.model = Qwen3Model.from_pretrained(windowed, config=config, dtype=torch.float32).eval()
    [result] = scorer.score_jobs([Job(id="w", query=QUERIES[0], items=DOCS[0])])
    assert gap(column(result), glob.scores(QUERIES[0], DOCS[0])) > 1e-3


def test_windowed_layers_without_a_window_stop_the_load(tmp_path):
    """`use_sliding_window: false` makes transformers drop the width; the kind says so at start."""
    from kafka_scorer.checkpoints.tiny_listwise import V35_LAYERS, build_tiny_listwise

    path = build_tiny_listwise(tmp_path, num_layers=4, layer_types=V35_LAYERS, sliding_window=WINDOW)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "use_sliding_window": False}))
    with pytest.raises(ModelLoadError, match="sliding_window"):
        Scorer(str(path), dtype="float32", device="cpu")
