"""Which `Scorer` serves a checkpoint: the one place that knows every kind's scorer class.

A ColBERT directory (`engine/late_interaction/checkpoint.py`) is served by `LateInteractionScorer`,
a Qwen3-VL one (`engine/vision/checkpoint.py`) by `VisionScorer`, every other checkpoint by `Scorer`.
The choice sits here, above these classes, because the subclasses
import `Scorer`: had `Scorer` picked its own subclass (it once did, in `__new__`), the engine's modules
would import each other in a circle. Callers that take any checkpoint (the worker, the demo, the bench)
open it here; a caller that knows its kind may name the class.
"""

from __future__ import annotations

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.late_interaction.checkpoint import is_late_interaction
from kafka_scorer.engine.late_interaction.scorer import LateInteractionScorer
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.engine.vision.checkpoint import is_vision_language
from kafka_scorer.engine.vision.scorer import VisionScorer


def scorer_class(model: str) -> type[Scorer]:
    """The class that serves the checkpoint at `model` (a local directory or a hub id)."""
    if is_vision_language(model):
        return VisionScorer
    return LateInteractionScorer if is_late_interaction(model) else Scorer


def open_scorer(model: str, **options: object) -> Scorer:
    """The engine for `model`, of its kind's class; `options` are `Scorer`'s keyword arguments."""
    return scorer_class(model)(model, **options)  # type: ignore[arg-type]  # options are Scorer's keyword arguments, passed through untyped


def scorer_from_config(config: EngineConfig) -> Scorer:
    """The engine as configured (the worker builds `config` from its settings), of its kind's class."""
    return scorer_class(config.model).from_config(config)
