"""Which kind serves a checkpoint: the one place that knows every kind (`kind.py`).

The kind is chosen from the checkpoint's files before any weight loads (infinity's model selection is
the model): a checkpoint laid out for a kind of its own (a Qwen-VL directory, a ColBERT directory, a
config naming `JinaForRanking`) is recognised by its files; every other one by its transformers config
(`engine/load/checkpoint.py`: an encoder family is a cross-encoder, a sequence classification head a
classifier, a CausalLM a label scorer). The first kind that claims the checkpoint opens it, loading
its weights its own way. A new kind is a file and a line in `KINDS`.
"""

from __future__ import annotations

from collections.abc import Sequence

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.classifier import ClassifierKind
from kafka_scorer.engine.kinds.cross_encoder import CrossEncoderKind
from kafka_scorer.engine.kinds.kind import Kind, KindClass
from kafka_scorer.engine.kinds.label_scorer import LabelScorerKind
from kafka_scorer.engine.kinds.late_interaction import LateInteractionKind
from kafka_scorer.engine.kinds.listwise import ListwiseKind
from kafka_scorer.engine.kinds.vision import VisionKind
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.transformers_parts import resolve_device

KINDS: tuple[KindClass, ...] = (
    VisionKind,
    LateInteractionKind,
    ListwiseKind,
    CrossEncoderKind,
    ClassifierKind,
    LabelScorerKind,
)
"""In the order they are asked: the layouts of their own first, the transformers config's last."""


def select_kind(checkpoint: Checkpoint, kinds: Sequence[KindClass] = KINDS) -> KindClass:
    """The kind that serves `checkpoint`, from its files alone; a checkpoint none claims is refused."""
    for kind in kinds:
        if kind.claims(checkpoint):
            return kind
    raise checkpoint.refusal()


def open_kind(config: EngineConfig, kinds: Sequence[KindClass] = KINDS) -> Kind:
    """The served checkpoint, loaded by the kind that claims it, as the object of that kind. The
    `device` setting is checked first: an unusable device is the operator's one line whatever the
    checkpoint holds."""
    resolve_device(config.device)
    checkpoint = Checkpoint(config.model, config.trust_remote_code)
    return select_kind(checkpoint, kinds).open(config, checkpoint)
