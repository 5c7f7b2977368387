"""One selector (`engine/kinds/choice.py`) gives each checkpoint the object of its kind, from a path and
from the engine's configuration alike (the worker opens its model from the configuration), and each
kind's settings reach it. What each kind scores is tested against its own reference elsewhere
(transformers pair by pair, CrossEncoder, sentence-transformers' ColBERT encoder)."""

from __future__ import annotations

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.classifier import ClassifierKind
from kafka_scorer.engine.kinds.cross_encoder import CrossEncoderKind
from kafka_scorer.engine.kinds.label_scorer import LabelScorerKind
from kafka_scorer.engine.kinds.late_interaction import LateInteractionKind
from kafka_scorer.engine.models.loaded import Architecture
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Job

CPU = {"dtype": "float32", "device": "cpu"}


def test_a_colbert_directory_is_served_by_the_late_interaction_kind(tiny_colbert):
    path = str(tiny_colbert())
    opened = Scorer(path, embedding_cache_mb=1, **CPU)
    assert (
        type(opened.describe().kind) is LateInteractionKind
        and opened.describe().loaded.architecture is Architecture.LATE_INTERACTION
    )
    assert opened.describe().fields["embedding_cache_mb"] == "1"  # the kind's own setting reached it
    configured = Scorer.from_config(EngineConfig(model=path, embedding_cache_mb=2, **CPU))
    assert type(configured.describe().kind) is LateInteractionKind
    assert configured.describe().fields["embedding_cache_mb"] == "2"
    assert configured.engine.stats().embedding_cache is not None


def test_transformers_checkpoints_are_served_by_the_kind_their_config_names(tiny_models, tiny_encoder):
    causal = Scorer(str(tiny_models.get()), **CPU)
    assert (
        type(causal.describe().kind) is LabelScorerKind
        and causal.describe().loaded.architecture is Architecture.CAUSAL_LM
    )
    classifier = Scorer(str(tiny_models.get(kind="classification", num_labels=3)), **CPU)
    assert (
        type(classifier.describe().kind) is ClassifierKind
        and classifier.describe().loaded.architecture is Architecture.CLASSIFICATION
    )
    encoder = Scorer.from_config(EngineConfig(model=str(tiny_encoder("bert")), **CPU))
    assert (
        type(encoder.describe().kind) is CrossEncoderKind
        and encoder.describe().loaded.architecture is Architecture.CLASSIFICATION
    )
    assert encoder.engine.stats().embedding_cache is None  # a kind without one reports none


def test_each_row_is_as_wide_as_its_kind_says(tiny_models):
    """A classifier's rows keep every class; a label scorer's rows are as wide as their own job's labels,
    two jobs of two labels and one sharing a forward."""
    classifier = Scorer(str(tiny_models.get(kind="classification", num_labels=3)), **CPU)
    assert [len(row) for row in classifier.score([1, 2, 3], [[4], [5, 6]]).scores] == [3, 3]
    causal = Scorer(str(tiny_models.get()), **CPU)
    jobs = [
        Job(id=job_id, query=[1, 2, 3], items=[[4], [5, 6]], label_token_ids=labels)
        for job_id, labels in (("a", [5, 6]), ("b", [7]))
    ]
    assert [[len(row) for row in result.scores] for result in causal.score_jobs(jobs)] == [[2, 2], [1, 1]]
