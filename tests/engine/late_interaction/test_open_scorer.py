"""The factory (`engine/load/choice.py`) opens each checkpoint with its kind's scorer class, from a path and
from the engine's configuration alike (the worker opens its model from the configuration). The scores of
the class it picks are tested against sentence-transformers in test_late_scores.py."""

from __future__ import annotations

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.late_interaction.scorer import LateInteractionScorer
from kafka_scorer.engine.load.choice import open_scorer, scorer_from_config
from kafka_scorer.engine.load.loaded_model import ModelKind
from kafka_scorer.engine.scorer import Scorer


def test_a_colbert_directory_opens_as_the_late_interaction_scorer(tiny_colbert):
    path = str(tiny_colbert())
    opened = open_scorer(path, dtype="float32", device="cpu", embedding_cache_mb=1)
    assert type(opened) is LateInteractionScorer and opened.kind is ModelKind.LATE_INTERACTION
    assert opened.description["embedding_cache_mb"] == "1"  # the subclass's own option reached it
    config = EngineConfig(model=path, dtype="float32", device="cpu", embedding_cache_mb=2)
    configured = scorer_from_config(config)
    assert type(configured) is LateInteractionScorer
    assert configured.description["embedding_cache_mb"] == "2"


def test_other_checkpoints_open_as_the_plain_scorer(tiny_models, tiny_encoder):
    causal = open_scorer(str(tiny_models.get()), dtype="float32", device="cpu")
    assert type(causal) is Scorer and causal.kind is ModelKind.CAUSAL_LM
    config = EngineConfig(model=str(tiny_encoder("bert")), dtype="float32", device="cpu")
    assert type(scorer_from_config(config)) is Scorer
