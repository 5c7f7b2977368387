"""A decoder with a classification (or reward) head: each item's scores are the head's classes at
the pair's last token. Packed, cached and graphed as the label scorer is; only its head differs."""

from __future__ import annotations

from kafka_scorer.engine.kinds.text import TextKind
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.models.loaded import Architecture


class ClassifierKind(TextKind):
    """Every column of the head's output is a score, its classes the job's fields speak of
    (`TextKind.width`, `TextKind.score_fields`)."""

    @classmethod
    def claims(cls, checkpoint: Checkpoint) -> bool:
        """A classifier whose config is no encoder family (that one is a cross-encoder)."""
        return checkpoint.architecture is Architecture.CLASSIFICATION and checkpoint.encoder_family is None
