"""Loading an encoder cross-encoder checkpoint (BERT, RoBERTa, ModernBERT, ...): the stock
`*ForSequenceClassification` model, its family's pair encoding and pooling (`engine/models/
encoder_family.py`); pairs then run in one varlen forward with block-diagonal bidirectional attention.
"""

from __future__ import annotations

import logging

from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.transformers_parts import common_fields, load_weights
from kafka_scorer.engine.models.encoder_family import EncoderHead, EncoderSetupError, encoder_spec
from kafka_scorer.engine.models.loaded import Architecture, LoadedModel, ModelLoadError

log = logging.getLogger(__name__)

_MIS_REASON = "bidirectional attention would let the query and every item see each other"


def load_encoder(
    checkpoint: Checkpoint, family: str, *, served_name: str | None, dtype: str, device: str
) -> LoadedModel:
    from transformers import AutoModelForSequenceClassification

    config = checkpoint.config
    weights = load_weights(checkpoint, AutoModelForSequenceClassification, "cross_encoder", dtype, device)
    model = weights.model
    try:
        encoder = encoder_spec(family, config, model, weights.tokenizer)
        head = EncoderHead(family, model)
    except EncoderSetupError as exc:
        raise ModelLoadError(f"model: {exc}") from exc
    log.info(
        "%s: %s cross-encoder; pairs in one varlen forward with block-diagonal bidirectional attention, "
        "%s pooling, at most %d tokens per pair",
        checkpoint.path,
        family,
        "mean" if encoder.mean_pooling else "first-token",
        encoder.max_positions,
    )
    return LoadedModel(
        **common_fields(checkpoint, weights, served_name),
        architecture=Architecture.CLASSIFICATION,
        body=model.base_model,
        head=head,
        output_vocab_size=int(config.vocab_size),
        max_positions=encoder.max_positions,
        mis_block_reason=_MIS_REASON,
        # an encoder's windowed layers (ModernBERT) name their own window in each attention call
        sliding_window=None,
        encoder=encoder,
        num_classes=int(config.num_labels or 0),
    )
