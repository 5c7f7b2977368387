"""What a Scorer serves and how, as plain strings: the worker's start-up line and its info metric."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka_scorer.engine.scorer import Scorer


def describe(scorer: Scorer) -> dict[str, str]:
    prefixes = scorer.prefix_cache_capacity_mb
    return {
        "model": scorer.model_name,
        "kind": scorer.kind.value,
        "device": str(scorer.loaded.device),
        "dtype": scorer.dtype_name,
        "attention_backend": scorer.attention_backend,
        "deterministic": str(scorer.deterministic).lower(),
        "decoder_forward": type(scorer.loaded.body).__name__,
        "max_batch_tokens": str(scorer.max_batch_tokens),
        "max_pair_tokens": str(scorer.limits.max_pair_tokens),
        "revision": scorer.revision,
        "template": scorer.template.name if scorer.template else "",
        "prefix_cache_mb": f"{prefixes:g}",
    }
