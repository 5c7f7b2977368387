"""Loading a decoder checkpoint (a CausalLM label scorer, a classifier or reward model, a hybrid with
linear-attention layers) and deciding what it can do: MIS, a sliding window, soft-capping, the fused
layers (`engine/models/`) or transformers' own, the stateful layers' wrappers (`engine/recurrent/`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from kafka_scorer.engine.attention.registry import ATTENTION_IMPLEMENTATION
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.transformers_parts import common_fields, load_weights
from kafka_scorer.engine.models.loaded import Architecture, LoadedModel, ModelLoadError
from kafka_scorer.engine.recurrent.detection import (
    STATEFUL_LAYER_TYPES,
    RecurrentSpec,
    StatefulLayerError,
    prepare_recurrent,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

_CLASSIFICATION_HEAD_NAMES = ("score", "classifier", "v_head")
DECODER_FORWARDS = ("auto", "fused", "compiled", "transformers")


def load_decoder(
    checkpoint: Checkpoint,
    architecture: Architecture,
    *,
    served_name: str | None,
    dtype: str,
    device: str,
    decoder_forward: str = "auto",
) -> LoadedModel:
    """The decoder `checkpoint` as `architecture` says (its LM head, or its classification head)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = checkpoint.config
    causal = architecture is Architecture.CAUSAL_LM
    stateful = bool(set(getattr(config, "layer_types", None) or ()) & STATEFUL_LAYER_TYPES)
    precision_kind = "hybrid" if stateful and causal else ("label_scorer" if causal else "classifier")
    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    weights = load_weights(checkpoint, auto, precision_kind, dtype, device)
    model = weights.model
    if causal:
        head = model.get_output_embeddings()
        if head is None:
            raise ModelLoadError(f"{type(model).__name__}: no output embeddings (LM head)")
        output_vocab = int(head.weight.shape[0])
    else:
        head = _classification_head(model)
        output_vocab = int(config.vocab_size)
        if _sees_later_tokens(model, output_vocab):
            raise ModelLoadError(
                f"{type(model).__name__} (model_type {getattr(config, 'model_type', None)!r}) attends "
                "bidirectionally, but it is not an encoder family kafka-scorer serves exactly (BERT, "
                "RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, ELECTRA, ModernBERT); its scores would be wrong"
            )
    try:
        recurrent = prepare_recurrent(model, config)
    except StatefulLayerError as exc:
        raise ModelLoadError(f"model: {exc}") from exc
    return LoadedModel(
        **common_fields(checkpoint, weights, served_name),
        architecture=architecture,
        body=_decoder_body(model.base_model, decoder_forward, weights.device),
        head=head,
        output_vocab_size=output_vocab,
        max_positions=getattr(config, "max_position_embeddings", None),
        mis_block_reason=_mis_block_reason(config, recurrent),
        sliding_window=_sliding_window(config),
        final_logit_softcap=_final_logit_softcap(config) if causal else None,
        num_classes=0 if causal else int(config.num_labels or 0),
        recurrent=recurrent,
    )


def _mis_block_reason(config, recurrent: RecurrentSpec | None) -> str | None:
    """Layers packing would get wrong: any but plain causal attention, except stateful layers the
    engine runs per sequence and per item (`engine/recurrent/`), which are exact under MIS too."""
    layer_types = getattr(config, "layer_types", None) or []
    exact = {"full_attention", "sliding_attention"} | ({"linear_attention"} if recurrent else set())
    odd = sorted({t for t in layer_types if t not in exact})
    if odd:
        return f"layers of type {odd} are not plain causal attention"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder models are not packed"
    return None


def _sliding_window(config) -> int | None:
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types and "sliding_attention" not in layer_types:
        return None
    return int(window)


def _final_logit_softcap(config) -> float | None:
    """Gemma 2's cap on LM-head logits (transformers' score heads do not apply it). Attention
    soft-capping needs nothing here: each layer hands its cap to our attention function."""
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if cap else None


@torch.no_grad()
def _sees_later_tokens(model: PreTrainedModel, vocab_size: int) -> bool:
    """Whether the first token's final state depends on a later token: bidirectional attention.

    Behaviour, not names: a classifier of a family `engine/models/encoder_family.py` does not know
    (DeBERTa, MPNet, remote code) would otherwise be served as a decoder, its pairs run as one causal
    stream, and its scores come back wrong without an error. Two 8-token forwards with transformers'
    eager attention, alike but for their last tokens, run separately: a causal model computes its first
    row from the same numbers both times. A mixture-of-experts layer may round it differently (each
    expert's matmul covers the tokens routed to it, a different set each time: Qwen3-Next's first row
    moved by 1e-6 of its size), so only a difference above rounding counts (1e-4 of the row's size; a
    later token's whole contribution is far larger).
    """
    device = next(model.parameters()).device
    firsts = []
    try:
        model.set_attn_implementation("eager")
        for tail in ([4, 5, 6, 7, 8], [9, 10, 11, 12, 13]):
            ids = torch.tensor([[1, 2, 3, *tail]], device=device).clamp(max=vocab_size - 1)
            firsts.append(model.base_model(input_ids=ids)[0][0, 0].float())
    except Exception as exc:  # a model the probe cannot run is served as before, and the log says so
        log.warning("could not probe %s for bidirectional attention (%s)", type(model).__name__, exc)
        return False
    finally:
        model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    return bool((firsts[0] - firsts[1]).abs().max() > 1e-4 * firsts[0].abs().max().clamp(min=1.0))


def _classification_head(model: nn.Module) -> nn.Module:
    for name in _CLASSIFICATION_HEAD_NAMES:
        head = getattr(model, name, None)
        if isinstance(head, nn.Module):
            return head
    raise ModelLoadError(
        f"{type(model).__name__}: no classification head found (looked for {_CLASSIFICATION_HEAD_NAMES})"
    )


def _decoder_body(body: nn.Module, decoder_forward: str, device: torch.device) -> nn.Module:
    """The engine's fused decoder (`engine/models/`) where the family has one, else transformers' body.

    auto: fused, compiled on CUDA (compiled at warm-up) and eager on the CPU, where compiling costs
    start-up time for little (the CPU's forward is in its matmuls); transformers: the checkpoint's own
    layers, the reference the fused forward is tested against."""
    from kafka_scorer.engine.models.decoder import fused_decoder

    if decoder_forward not in DECODER_FORWARDS:
        raise ModelLoadError(f"decoder_forward: {decoder_forward!r} is not one of {list(DECODER_FORWARDS)}")
    if decoder_forward == "transformers":
        return body
    compiled = decoder_forward == "compiled" or (decoder_forward == "auto" and device.type == "cuda")
    return fused_decoder(body, compiled) or body
