"""Which kind serves a checkpoint: the one place that knows every kind (`kind.py`).

A checkpoint laid out for a kind of its own (a Qwen-VL directory, a ColBERT directory, a config naming
`JinaForRanking`) is recognised by its files before anything loads; every other one is a transformers
checkpoint, whose config says what it is (`engine/load/loaded_model.py`: an encoder family is a
cross-encoder, a sequence classification head a classifier, the rest a label scorer). A new kind is a
file and a line here.
"""

from __future__ import annotations

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.classifier import ClassifierKind
from kafka_scorer.engine.kinds.cross_encoder import CrossEncoderKind
from kafka_scorer.engine.kinds.kind import Kind
from kafka_scorer.engine.kinds.label_scorer import LabelScorerKind
from kafka_scorer.engine.kinds.late_interaction import open_late_interaction
from kafka_scorer.engine.kinds.listwise import open_listwise
from kafka_scorer.engine.kinds.served import load_options, serve
from kafka_scorer.engine.kinds.vision import open_vision
from kafka_scorer.engine.late_interaction.checkpoint import is_late_interaction
from kafka_scorer.engine.listwise.checkpoint import is_listwise
from kafka_scorer.engine.load.loaded_model import load_model
from kafka_scorer.engine.models.loaded import ModelKind
from kafka_scorer.engine.vision.checkpoint import is_vision_language


def open_kind(config: EngineConfig) -> Kind:
    """The served checkpoint, loaded, as the object of its kind."""
    if is_vision_language(config.model):
        return open_vision(config)
    if is_late_interaction(config.model):
        return open_late_interaction(config)
    if is_listwise(config.model):
        return open_listwise(config)
    loaded = load_model(config.model, **load_options(config), decoder_forward=config.decoder_forward)
    served = serve(loaded, config)
    if loaded.encoder is not None:
        return CrossEncoderKind(served)
    if loaded.kind is ModelKind.CLASSIFICATION:
        return ClassifierKind(served)
    return LabelScorerKind(served)
