"""Loading a ColBERT checkpoint: the encoder with our attention, its projection, and the token ids of
its markers, expansion token and skiplist, all resolved once here so preparing a job only reads them."""

from __future__ import annotations

import logging

from kafka_scorer.engine.attention.registry import ATTENTION_IMPLEMENTATION, register_attention
from kafka_scorer.engine.late_interaction.checkpoint import (
    CheckpointError,
    ColbertSettings,
    Projection,
    read_projection,
    read_settings,
)
from kafka_scorer.engine.late_interaction.spec import LateModel, LateSpec
from kafka_scorer.engine.load.precision import choose_precision
from kafka_scorer.engine.load.revision import checkpoint_revision
from kafka_scorer.engine.load.transformers_parts import resolve_device
from kafka_scorer.engine.models.encoder_family import ENCODER_FAMILIES, EncoderSetupError, encoder_spec
from kafka_scorer.engine.models.loaded import Architecture, ModelLoadError
from kafka_scorer.engine.prepare.text_bounds import leading_special_tokens

log = logging.getLogger(__name__)

_MIS_REASON = "a late-interaction model encodes the query and each document on their own"


def load_late_interaction(
    model_path: str, *, served_name: str | None, dtype: str, device: str, trust_remote_code: bool
) -> LateModel:
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    register_attention()
    torch_device = resolve_device(device)
    precision = choose_precision(dtype, torch_device, "late_interaction")
    torch_dtype = precision.dtype
    try:
        settings = read_settings(model_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        projection = read_projection(model_path, int(config.hidden_size))
    except (CheckpointError, OSError, ValueError) as exc:
        raise ModelLoadError(
            f"model: {model_path!r} is not a ColBERT checkpoint kafka-scorer can serve: {exc}"
        ) from None
    family = getattr(config, "model_type", None)
    if family not in ENCODER_FAMILIES:
        raise ModelLoadError(
            f"model: the ColBERT encoder of {model_path!r} is a {family!r}; served encoder families are "
            f"{sorted(ENCODER_FAMILIES)}"
        )
    try:
        model = AutoModel.from_pretrained(
            model_path,
            dtype=torch_dtype,
            attn_implementation=ATTENTION_IMPLEMENTATION,
            trust_remote_code=trust_remote_code,
        )
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(f"model: cannot load the encoder or tokenizer of {model_path!r}: {exc}") from exc
    model.to(torch_device).eval().requires_grad_(False)
    projection.to(device=torch_device, dtype=torch_dtype).eval().requires_grad_(False)
    try:
        encoder = encoder_spec(family, config, model, tokenizer)
    except EncoderSetupError as exc:
        raise ModelLoadError(f"model: {exc}") from exc
    spec = _late_spec(settings, projection, tokenizer, model)
    longest = max(settings.query_length, settings.document_length)
    if longest > encoder.max_positions:
        raise ModelLoadError(
            f"model: query_length/document_length {longest} exceeds the encoder's {encoder.max_positions} "
            "positions"
        )
    log.info(
        "%s: late-interaction (ColBERT) %s, %d-dim token vectors, query %d tokens%s, documents up to %d",
        model_path,
        family,
        spec.dim,
        settings.query_length,
        " (expanded)" if settings.query_expansion else "",
        settings.document_length,
    )
    vocab = int(model.get_input_embeddings().num_embeddings)
    return LateModel(
        name=served_name or model_path,
        architecture=Architecture.LATE_INTERACTION,
        model=model,
        body=model,
        head=projection,
        tokenizer=tokenizer,
        device=torch_device,
        dtype=torch_dtype,
        dtype_reason=precision.reason,
        input_vocab_size=vocab,
        output_vocab_size=vocab,
        max_positions=settings.document_length,
        mis_block_reason=_MIS_REASON,
        sliding_window=None,
        encoder=encoder,
        num_classes=1,
        revision=_revision(model_path),
        late=spec,
    )


def _late_spec(settings: ColbertSettings, projection: Projection, tokenizer, model) -> LateSpec:
    import inspect

    lead, tail = leading_special_tokens(tokenizer)
    unk = tokenizer.unk_token_id

    def marker(text: str, what: str) -> tuple[int, ...]:
        if not text:
            return ()
        token = tokenizer.convert_tokens_to_ids(text)
        if token is None or token == unk:
            raise ModelLoadError(
                f"model: the {what} marker {text!r} is not a token of the checkpoint's tokenizer; a ColBERT "
                "checkpoint saves it as an added token (PyLate does)"
            )
        return (int(token),)

    expansion = next(
        (
            t
            for t in (tokenizer.mask_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
            if t is not None
        ),
        None,
    )
    if expansion is None and settings.query_expansion:
        raise ModelLoadError("model: query expansion needs a mask, eos or pad token; the tokenizer has none")
    # Words that are not one token of the vocabulary are dropped (sentence-transformers' rule): mapped
    # to the unknown token they would drop every real [UNK] of a document.
    skip = {tokenizer.convert_tokens_to_ids(word) for word in settings.skiplist_words}
    skip = {int(t) for t in skip if t is not None and t != unk}
    takes_types = "token_type_ids" in inspect.signature(model.forward).parameters
    return LateSpec(
        settings=settings,
        projection=projection,
        lead=tuple(lead),
        tail=tuple(tail),
        query_marker=marker(settings.query_marker, "query"),
        document_marker=marker(settings.document_marker, "document"),
        expansion_id=int(expansion or 0),
        skiplist_ids=frozenset(skip),
        takes_token_types=takes_types,
    )


def _revision(model_path: str) -> str:
    """The encoder's revision (`engine/load/revision.py`) extended over what else decides a ColBERT score:
    the Dense folders' config and weights, `modules.json` and the ColBERT settings."""
    import hashlib
    import json
    from pathlib import Path

    root = Path(model_path)
    parts = [checkpoint_revision(model_path)]
    for name in ("modules.json", "config_sentence_transformers.json"):
        parts.append(hashlib.sha256((root / name).read_bytes()).hexdigest())
    for module in json.loads((root / "modules.json").read_text())[1:]:
        parts.append(checkpoint_revision(str(root / str(module.get("path", "")))))
    return "sha256:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
