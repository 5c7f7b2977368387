"""An encoder cross-encoder (BERT, RoBERTa, ModernBERT, ...): each pair is the tokenizer's own pair
encoding, scored at its first token (or the mean of its tokens) by the stock classifier head.

Bidirectional attention lets every token see what follows it, so a prefix's states depend on the
rest: no prefix cache, no MIS (`LoadedModel.mis_block_reason`), and no prompt template (the pair
encoding is the checkpoint's; the setting is refused at start with one line, before anything loads).
"""

from __future__ import annotations

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.text import TextKind
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.encoder import load_encoder
from kafka_scorer.engine.models.loaded import LoadedModel
from kafka_scorer.engine.prepare.encoder_pairs import EncoderPreparer
from kafka_scorer.errors import SettingError


class CrossEncoderKind(TextKind):
    preparer_class = EncoderPreparer

    @classmethod
    def claims(cls, checkpoint: Checkpoint) -> bool:
        return checkpoint.encoder_family is not None

    @classmethod
    def check_settings(cls, config: EngineConfig) -> None:
        if config.template:
            raise SettingError(
                "template",
                f"template={config.template!r} but {config.model!r} is an encoder cross-encoder, whose "
                "pairs are its tokenizer's own pair encoding: unset --template (KAFKA_SCORER_TEMPLATE) for "
                "this model",
            )

    @classmethod
    def load(cls, config: EngineConfig, checkpoint: Checkpoint) -> LoadedModel:
        family = checkpoint.encoder_family
        assert family is not None  # claims() said so
        return load_encoder(
            checkpoint, family, served_name=config.served_model_name, dtype=config.dtype, device=config.device
        )
