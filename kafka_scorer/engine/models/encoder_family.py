"""Encoder cross-encoders (BERT, RoBERTa/XLM-R, DistilBERT, ELECTRA, ModernBERT): what differs from decoders.

A cross-encoder reads its pair bidirectionally and scores it from the first token (`[CLS]` / `<s>`), or
from the mean of all tokens (ModernBERT's `classifier_pooling: mean`). Three things must match the stock
model exactly, or the scores drift without any error:
- the pair encoding: the tokenizer's own template (`[CLS] a [SEP] b [SEP]` with token type ids 0/1 for
  BERT, `<s> a </s></s> b </s>` for RoBERTa), read off the tokenizer once at load by encoding a probe pair,
  so token-id inputs get exactly the special tokens and type ids a text pair would;
- position ids: from 0 per pair, except RoBERTa-style models, which count from `padding_idx + 1` and give
  pad tokens the position `padding_idx` (fairseq's rule);
- the head: whatever the stock `*ForSequenceClassification` applies after the encoder stack (BERT's
  pooler, RoBERTa's and ELECTRA's classification heads, DistilBERT's pre-classifier, ModernBERT's
  prediction head), applied here to one pooled row per pair.

The family is read from `config.model_type`, never from the checkpoint's name.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from kafka_scorer.engine.layers.parts import optional_submodule, submodule

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PositionRule = Literal["from_zero", "after_padding"]
HeadShape = Literal["pooler", "features", "pre_classifier", "prediction_head"]

_PROBE = ("probe query", "probe document")


@dataclass(frozen=True)
class _Family:
    positions: PositionRule
    head: HeadShape


ENCODER_FAMILIES: dict[str, _Family] = {
    "bert": _Family("from_zero", "pooler"),
    "roberta": _Family("after_padding", "features"),
    "xlm-roberta": _Family("after_padding", "features"),
    "camembert": _Family("after_padding", "features"),
    "electra": _Family("from_zero", "features"),
    "distilbert": _Family("from_zero", "pre_classifier"),
    "modernbert": _Family("from_zero", "prediction_head"),
}


class EncoderSetupError(RuntimeError):
    """The checkpoint is an encoder that cannot be served exactly; the message says why."""


def encoder_family(config) -> str | None:
    """The encoder family of a `*ForSequenceClassification` config, or None for a decoder."""
    model_type = getattr(config, "model_type", None)
    if model_type not in ENCODER_FAMILIES:
        return None
    if getattr(config, "is_decoder", False):
        raise EncoderSetupError(
            f"config.is_decoder=true on a {model_type} classifier: a causal {model_type} is not a "
            "cross-encoder; set is_decoder to false in config.json if the model was trained bidirectionally"
        )
    return model_type


@dataclass(frozen=True)
class PairTemplate:
    """The tokenizer's pair encoding: `prefix a middle b suffix`, each part with its token type ids."""

    prefix: tuple[int, ...]
    middle: tuple[int, ...]
    suffix: tuple[int, ...]
    types: tuple[tuple[int, ...], int, tuple[int, ...], int, tuple[int, ...]] | None
    """Type ids of prefix, a, middle, b, suffix; None when the tokenizer returns none (RoBERTa)."""

    @property
    def num_special(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    def join(self, a: list[int], b: list[int]) -> tuple[list[int], list[int] | None]:
        ids = [*self.prefix, *a, *self.middle, *b, *self.suffix]
        if self.types is None:
            return ids, None
        prefix, type_a, middle, type_b, suffix = self.types
        return ids, [*prefix, *[type_a] * len(a), *middle, *[type_b] * len(b), *suffix]


def read_pair_template(tokenizer) -> PairTemplate:
    """Encode a probe pair with and without special tokens and read the template off the difference."""
    a = list(tokenizer(_PROBE[0], add_special_tokens=False)["input_ids"])
    b = list(tokenizer(_PROBE[1], add_special_tokens=False)["input_ids"])
    encoded = tokenizer(*_PROBE)
    full = list(encoded["input_ids"])
    start_a = _find(full, a, 0)
    start_b = _find(full, b, start_a + len(a)) if start_a >= 0 else -1
    if not a or not b or start_a < 0 or start_b < 0:
        raise EncoderSetupError(
            f"{type(tokenizer).__name__}: cannot read its pair encoding (the pieces of a probe pair do not "
            "appear in the encoded pair); serve it with a tokenizer whose pair template only adds tokens"
        )
    end_a, end_b = start_a + len(a), start_b + len(b)
    types = encoded.get("token_type_ids")
    parts = None
    if types is not None:
        types = list(types)
        parts = (
            tuple(types[:start_a]),
            _uniform(types[start_a:end_a]),
            tuple(types[end_a:start_b]),
            _uniform(types[start_b:end_b]),
            tuple(types[end_b:]),
        )
    return PairTemplate(
        prefix=tuple(full[:start_a]),
        middle=tuple(full[end_a:start_b]),
        suffix=tuple(full[end_b:]),
        types=parts,
    )


def _find(haystack: list[int], needle: list[int], start: int) -> int:
    for index in range(start, len(haystack) - len(needle) + 1):
        if haystack[index : index + len(needle)] == needle:
            return index
    return -1


def _uniform(types: list[int]) -> int:
    if len(set(types)) != 1:
        raise EncoderSetupError(
            f"token type ids vary inside one segment of the pair ({types}); not supported"
        )
    return types[0]


@dataclass(frozen=True)
class EncoderSpec:
    """Everything the engine needs to run one encoder family exactly like its stock model."""

    family: str
    positions: PositionRule
    padding_idx: int
    takes_token_types: bool
    mean_pooling: bool
    template: PairTemplate | None
    """None when the checkpoint ships no tokenizer: then no pair can be built
    (see `engine/prepare/inputs.py`)."""
    max_positions: int
    """Longest pair the position embeddings allow (RoBERTa: max_position_embeddings - padding_idx - 1)."""

    # What the packed stream asks of an encoder (`engine/pack/stream_shape.py`'s `StreamShape`).
    @property
    def causal(self) -> bool:
        """Never: a pair is read bidirectionally."""
        return False

    def pair_row(self, start: int, length: int) -> int:
        """A pair is scored at its first token (`[CLS]` / `<s>`), whatever its length."""
        return start

    def position_ids(self, ids: list[int]) -> list[int]:
        """One pair's position ids, as the stock embeddings compute them for an unpadded input."""
        if self.positions == "from_zero":
            return list(range(len(ids)))
        pad = self.padding_idx
        positions, count = [], 0
        for token in ids:
            if token == pad:
                positions.append(pad)
            else:
                count += 1
                positions.append(pad + count)
        return positions


def encoder_spec(family: str, config, model: PreTrainedModel, tokenizer) -> EncoderSpec:
    rule = ENCODER_FAMILIES[family].positions
    padding_idx = int(getattr(config, "pad_token_id", None) or 0)
    max_positions = int(config.max_position_embeddings)
    if rule == "after_padding":
        max_positions -= padding_idx + 1
    template = read_pair_template(tokenizer) if tokenizer is not None else None
    takes_types = "token_type_ids" in inspect.signature(model.base_model.forward).parameters
    if template is not None and template.types is not None and takes_types:
        highest = max([*template.types[0], template.types[1], *template.types[2], template.types[3], 0])
        type_vocab = int(getattr(config, "type_vocab_size", 1))
        if highest >= type_vocab:
            raise EncoderSetupError(
                f"the tokenizer gives token type id {highest} but config.type_vocab_size={type_vocab}; "
                "the tokenizer does not belong to this model"
            )
    return EncoderSpec(
        family=family,
        positions=rule,
        padding_idx=padding_idx,
        takes_token_types=takes_types and template is not None and template.types is not None,
        mean_pooling=getattr(config, "classifier_pooling", "cls") == "mean",
        template=template,
        max_positions=max_positions,
    )


class EncoderHead(nn.Module):
    """The stock classifier's computation from the pooled row (first token or mean) to logits.

    Dropout is left out: the model is in eval mode, where it is the identity.
    """

    def __init__(self, family: str, model: PreTrainedModel) -> None:
        super().__init__()
        self.shape = ENCODER_FAMILIES[family].head
        self.classifier = submodule(model, "classifier")
        self.pooler = optional_submodule(model.base_model, "pooler") if self.shape == "pooler" else None
        self.pre_classifier = (
            optional_submodule(model, "pre_classifier") if self.shape == "pre_classifier" else None
        )
        self.prediction_head = optional_submodule(model, "head") if self.shape == "prediction_head" else None
        if self.shape == "pooler" and self.pooler is None:
            raise EncoderSetupError(
                f"{type(model).__name__} has no pooler; its classifier would read nothing"
            )

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        if self.shape == "pooler" and self.pooler is not None:  # not None: checked at construction
            return self.classifier(self.pooler(rows[:, None]))
        if self.shape == "features":
            return self.classifier(rows[:, None])
        if self.shape == "pre_classifier" and self.pre_classifier is not None:
            return self.classifier(torch.relu(self.pre_classifier(rows)))
        if self.prediction_head is not None:
            return self.classifier(self.prediction_head(rows))
        raise EncoderSetupError(f"the {self.shape!r} head has no module before its classifier")
