"""A decoder (CausalLM) served as a label scorer: each item's scores are the probabilities (or
log-probabilities) of the job's label tokens after its pair (SPEC §4), so a row is as wide as the
job's labels, whatever the widest job of its forward brought. Hybrid decoders (linear-attention
layers, `engine/recurrent/`) are label scorers too, loaded with their stateful layers wrapped."""

from __future__ import annotations

from kafka_scorer.engine.kinds.served import Served
from kafka_scorer.engine.kinds.text import TextKind
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.models.loaded import Architecture
from kafka_scorer.engine.prepare.labels import LabelResolver
from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.engine.prepare.score_fields import LabelFields


class LabelScorerKind(TextKind):
    scores_labels = True
    architecture = Architecture.CAUSAL_LM

    @classmethod
    def claims(cls, checkpoint: Checkpoint) -> bool:
        return checkpoint.architecture is Architecture.CAUSAL_LM

    def score_fields(self, served: Served) -> LabelFields:
        loaded = served.loaded
        resolver = LabelResolver(loaded.tokenizer, loaded.output_vocab_size)
        return LabelFields(served.limits, resolver, loaded.output_vocab_size, served.template)

    def width(self, piece: PreparedJob, row: list[float]) -> int:
        return len(piece.label_ids)
