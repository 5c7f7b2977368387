"""An encoder cross-encoder (BERT, RoBERTa, ModernBERT, ...): each pair is the tokenizer's own pair
encoding, scored at its first token (or the mean of its tokens) by the stock classifier head. Its
`EncoderSpec` is the stream's shape (positions, token types, the row a pair is scored at, bidirectional
attention: `engine/pack/stream_shape.py`), and its body is called without a decoder's options.

Bidirectional attention lets every token see what follows it, so a prefix's states depend on the
rest: no prefix cache and no MIS (both refused by `LoadedModel.mis_block_reason`), and no prompt
template (the pair encoding is the checkpoint's; the setting is refused at start with one line, before
anything loads).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.served import Served
from kafka_scorer.engine.kinds.text import TextKind
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.encoder import load_encoder
from kafka_scorer.engine.models.loaded import LoadedModel
from kafka_scorer.engine.prepare.encoder_pairs import EncoderPreparer
from kafka_scorer.errors import SettingError


class CrossEncoderKind(TextKind):
    preparer_class = EncoderPreparer
    body_options: Mapping[str, object] = MappingProxyType({})
    """None: an encoder has no KV cache to turn off, and some families' forward takes no `use_cache`."""

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

    def __init__(self, served: Served) -> None:
        encoder = served.loaded.encoder
        assert encoder is not None  # `claims` picks this kind for encoders only
        self.shape = encoder  # how its pairs lie in the packed stream (`pack/stream_shape.py`)
        super().__init__(served)
