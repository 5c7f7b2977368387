"""Loading a checkpoint and deciding what it can do.

The model kind comes from the config's `architectures`, never from the checkpoint's name: a reranker
called "...-Reranker" may be a CausalLM or a classifier; a classifier whose `model_type` is an encoder
family (BERT, RoBERTa, ...) is a cross-encoder with bidirectional attention
(`engine/models/encoder_family.py`).
The HF model is loaded unchanged; only its attention function is swapped for ours (registered in
transformers' attention registry), so any decoder whose attention goes through that registry gets
packing and MIS without a model rewrite, and any encoder gets varlen pairs without padding.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from kafka_scorer.engine.attention.registry import ATTENTION_IMPLEMENTATION, register_attention
from kafka_scorer.engine.load.precision import choose_precision
from kafka_scorer.engine.load.revision import checkpoint_revision
from kafka_scorer.engine.models.encoder_family import (
    EncoderHead,
    EncoderSetupError,
    encoder_family,
    encoder_spec,
)
from kafka_scorer.engine.models.loaded import LoadedModel, ModelKind, ModelLoadError
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
_ENCODER_MIS_REASON = "bidirectional attention would let the query and every item see each other"


def resolve_device(device: str) -> torch.device:
    """The torch device `device` names; a name torch does not know, or a GPU this process cannot use,
    is the `device` setting's fault and says so in one line (not a traceback from inside torch)."""
    from kafka_scorer.errors import SettingError

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError):
        raise SettingError(
            "device", f"device={device!r} is not a torch device: use auto, cpu, cuda or cuda:N (--device)"
        ) from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SettingError(
                "device",
                f"device={device!r} but this torch has no usable CUDA GPU (a CPU-only build, or no GPU "
                "visible): use --device auto or cpu, or install torch's CUDA build",
            )
        if resolved.index is not None and resolved.index >= count:
            raise SettingError("device", f"device={device!r} but only {count} GPU(s) are visible (--device)")
    return resolved


def resolve_dtype(dtype: str, device: torch.device, kind: str = "") -> torch.dtype:
    """The torch dtype `dtype` means for a `kind` (`engine/load/precision.py`; no kind: float32 where
    auto would need the kind's measured fidelity to choose)."""
    return choose_precision(dtype, device, kind).dtype


def served_kind(kind: ModelKind, encoder: bool, recurrent: bool) -> str:
    """The kind's name in `precision.BF16_RANKINGS_HOLD` for a transformers checkpoint."""
    if encoder:
        return "cross_encoder"
    if kind is ModelKind.CLASSIFICATION:
        return "classifier"
    return "hybrid" if recurrent else "label_scorer"


def detect_kind(architectures: list[str] | None) -> ModelKind:
    for arch in architectures or []:
        if arch.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")):
            return ModelKind.CAUSAL_LM
        if arch.endswith(("ForSequenceClassification", "ForRewardModel", "RewardModel")):
            return ModelKind.CLASSIFICATION
    raise ModelLoadError(
        f"config.architectures={architectures!r}: not a *ForCausalLM or *ForSequenceClassification model; "
        "kafka-scorer serves only those two kinds"
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


def _final_logit_softcap(config, kind: ModelKind) -> float | None:
    """Attention soft-capping needs nothing here: each layer hands its cap to our attention function."""
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if cap and kind is ModelKind.CAUSAL_LM else None


@torch.no_grad()
def _sees_later_tokens(model: PreTrainedModel, vocab_size: int) -> bool:
    """Whether the first token's final state depends on a later token: bidirectional attention.

    Behaviour, not names: a classifier of a family `engine/models/encoder_family.py` does not know
    (DeBERTa, MPNet,
    remote code) would otherwise be served as a decoder, its pairs run as one causal stream, and its
    scores come back wrong without an error. Two 8-token forwards with transformers' eager attention,
    alike but for their last tokens, run separately: a causal model computes its first row from the
    same numbers both times. A mixture-of-experts layer may round it differently (each expert's matmul
    covers the tokens routed to it, a different set each time: Qwen3-Next's first row moved by 1e-6 of
    its size), so only a difference above rounding counts (1e-4 of the row's size; a later token's
    whole contribution is far larger).
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


DECODER_FORWARDS = ("auto", "fused", "compiled", "transformers")


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


def load_model(
    model_path: str,
    *,
    served_name: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
    decoder_forward: str = "auto",
) -> LoadedModel:
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    register_attention()
    torch_device = resolve_device(device)
    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        hint = (
            "" if Path(model_path).exists() else " (no such local directory, and the hub id did not resolve)"
        )
        raise ModelLoadError(f"model: cannot load config of {model_path!r}{hint}: {exc}") from exc
    kind = detect_kind(getattr(config, "architectures", None))
    try:
        family = encoder_family(config) if kind is ModelKind.CLASSIFICATION else None
    except EncoderSetupError as exc:
        raise ModelLoadError(f"model: {exc}") from exc
    stateful = bool(set(getattr(config, "layer_types", None) or ()) & STATEFUL_LAYER_TYPES)
    precision = choose_precision(dtype, torch_device, served_kind(kind, family is not None, stateful))
    torch_dtype = precision.dtype
    auto = AutoModelForCausalLM if kind is ModelKind.CAUSAL_LM else AutoModelForSequenceClassification
    try:
        model = auto.from_pretrained(
            model_path,
            dtype=torch_dtype,
            attn_implementation=ATTENTION_IMPLEMENTATION,
            trust_remote_code=trust_remote_code,
        )
    except Exception as exc:
        raise ModelLoadError(f"model: cannot load weights of {model_path!r}: {exc}") from exc
    model.to(torch_device).eval()  # type: ignore[arg-type]  # transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to); typeshed's _Wrapped keeps the unbound signature, taking the device for `self`
    model.requires_grad_(False)

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        log.warning("no tokenizer for %s (%s): only token-id jobs can be served", model_path, exc)
        tokenizer = None
    if tokenizer is not None and len(tokenizer.get_vocab()) < 2:
        # transformers 5 builds an empty tokenizer when a checkpoint ships none; it would turn every
        # text into zero tokens, so treat it as missing.
        log.warning("no tokenizer files in %s: only token-id jobs can be served", model_path)
        tokenizer = None

    body = model.base_model
    if kind is ModelKind.CAUSAL_LM:
        head = model.get_output_embeddings()
        if head is None:
            raise ModelLoadError(f"{type(model).__name__}: no output embeddings (LM head)")
        output_vocab = int(head.weight.shape[0])
    else:
        head = _classification_head(model)
        output_vocab = int(config.vocab_size)
    if kind is ModelKind.CLASSIFICATION and family is None and _sees_later_tokens(model, output_vocab):
        raise ModelLoadError(
            f"{type(model).__name__} (model_type {getattr(config, 'model_type', None)!r}) attends "
            "bidirectionally, but it is not an encoder family kafka-scorer serves exactly (BERT, RoBERTa, "
            "XLM-RoBERTa, CamemBERT, DistilBERT, ELECTRA, ModernBERT); its scores would be wrong"
        )
    encoder = None
    if family is not None:
        try:
            encoder = encoder_spec(family, config, model, tokenizer)
            head = EncoderHead(family, model)
        except EncoderSetupError as exc:
            raise ModelLoadError(f"model: {exc}") from exc
        log.info(
            "%s: %s cross-encoder; pairs in one varlen forward with block-diagonal bidirectional attention, "
            "%s pooling, at most %d tokens per pair",
            model_path,
            family,
            "mean" if encoder.mean_pooling else "first-token",
            encoder.max_positions,
        )
    recurrent = None
    if encoder is None:
        try:
            recurrent = prepare_recurrent(model, config)
        except StatefulLayerError as exc:
            raise ModelLoadError(f"model: {exc}") from exc
        body = _decoder_body(body, decoder_forward, torch_device)
    return LoadedModel(
        name=served_name or model_path,
        kind=kind,
        model=model,
        body=body,
        head=head,
        tokenizer=tokenizer,
        device=torch_device,
        dtype=torch_dtype,
        dtype_reason=precision.reason,
        input_vocab_size=int(model.get_input_embeddings().num_embeddings),  # type: ignore[arg-type]  # an input embedding (nn.Embedding's shape) has an int num_embeddings; nn.Module types every attribute Tensor | Module
        output_vocab_size=output_vocab,
        max_positions=encoder.max_positions if encoder else getattr(config, "max_position_embeddings", None),
        mis_block_reason=_ENCODER_MIS_REASON if encoder else _mis_block_reason(config, recurrent),
        # An encoder's windowed layers (ModernBERT) name their own window in each attention call.
        sliding_window=None if encoder else _sliding_window(config),
        final_logit_softcap=_final_logit_softcap(config, kind),
        encoder=encoder,
        num_classes=int(config.num_labels) if kind is ModelKind.CLASSIFICATION else 0,
        revision=checkpoint_revision(model_path),
        recurrent=recurrent,
    )
