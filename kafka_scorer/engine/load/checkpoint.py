"""A checkpoint as the kind selector reads it: its path and its config, before any weight loads.

The kind is decided from files alone (`engine/kinds/choice.py`), so a checkpoint no kind serves is
refused before gigabytes are read, and each kind then loads only what it runs. A plain transformers
checkpoint's kind comes from its config's `architectures`, never from its name: a "...-Reranker" may be
a CausalLM or a classifier; a classifier whose `model_type` is an encoder family (BERT, RoBERTa, ...) is
a cross-encoder (`engine/models/encoder_family.py`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kafka_scorer.engine.models.encoder_family import EncoderSetupError, encoder_family
from kafka_scorer.engine.models.loaded import Architecture, ModelLoadError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
_CLASSIFIER_SUFFIXES = ("ForSequenceClassification", "ForRewardModel", "RewardModel")


@dataclass
class Checkpoint:
    path: str
    trust_remote_code: bool = False

    @functools.cached_property
    def config(self) -> PretrainedConfig:
        """transformers' config of the checkpoint (config.json only: no weights)."""
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
        except Exception as exc:
            missing = not Path(self.path).exists()
            hint = " (no such local directory, and the hub id did not resolve)" if missing else ""
            raise ModelLoadError(f"model: cannot load config of {self.path!r}{hint}: {exc}") from exc

    @functools.cached_property
    def architecture(self) -> Architecture | None:
        """CausalLM or classifier by the config's `architectures`; None for anything else."""
        for name in getattr(self.config, "architectures", None) or []:
            if name.endswith(_CAUSAL_SUFFIXES):
                return Architecture.CAUSAL_LM
            if name.endswith(_CLASSIFIER_SUFFIXES):
                return Architecture.CLASSIFICATION
        return None

    @functools.cached_property
    def encoder_family(self) -> str | None:
        """The encoder family of a classifier checkpoint (a cross-encoder), None for a decoder."""
        if self.architecture is not Architecture.CLASSIFICATION:
            return None
        try:
            return encoder_family(self.config)
        except EncoderSetupError as exc:
            raise ModelLoadError(f"model: {exc}") from exc

    def refusal(self) -> ModelLoadError:
        """What a checkpoint no kind claims is told."""
        architectures = getattr(self.config, "architectures", None)
        return ModelLoadError(
            f"config.architectures={architectures!r}: not a *ForCausalLM or *ForSequenceClassification "
            "model, nor a ColBERT, listwise or vision-language checkpoint; kafka-scorer serves only those"
        )
