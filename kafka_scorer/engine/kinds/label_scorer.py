"""A decoder (CausalLM) served as a label scorer: each item's scores are the probabilities (or
log-probabilities) of the job's label tokens after its pair (SPEC §4), so a row is as wide as the
job's labels, whatever the widest job of its forward brought."""

from __future__ import annotations

from kafka_scorer.engine.kinds.text import TextKind
from kafka_scorer.engine.prepare.prepared import PreparedJob


class LabelScorerKind(TextKind):
    def width(self, piece: PreparedJob, row: list[float]) -> int:
        return len(piece.label_ids)
