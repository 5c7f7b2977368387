"""What a Scorer serves and how, as plain strings: the worker's start-up line and its info metric."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs
    from kafka_scorer.engine.load.scorer_view import ScorerView


def describe(scorer: ScorerView) -> dict[str, str]:
    prefixes = scorer.prefix_cache_capacity_mb
    graphs = scorer.graphs
    return {
        "model": scorer.model_name,
        "kind": scorer.kind.value,
        "device": str(scorer.loaded.device),
        "dtype": scorer.dtype_name,
        "dtype_reason": scorer.loaded.dtype_reason,
        "attention_backend": scorer.attention_backend,
        "deterministic": str(scorer.deterministic).lower(),
        "decoder_forward": _decoder_forward(scorer),
        "label_kernels": scorer.runner.label_kernels,
        "max_batch_tokens": str(scorer.max_batch_tokens),
        "max_pair_tokens": str(scorer.limits.max_pair_tokens),
        "revision": scorer.revision,
        "template": scorer.template.name if scorer.template else "",
        "prefix_cache_mb": f"{prefixes:g}",
        "cuda_graphs": _graphs(graphs) if graphs is not None and graphs.ready else "off",
    }


def _decoder_forward(scorer: ScorerView) -> str:
    """fused-compiled, fused-eager (as asked, or after the warm-up found compiling broken), or the
    checkpoint's own body class (transformers' layers, an encoder)."""
    from kafka_scorer.engine.models.decoder import FusedDecoder

    body = scorer.loaded.body
    if isinstance(body, FusedDecoder):
        return "fused-compiled" if body.regions.compiled else "fused-eager"
    return type(body).__name__


def _graphs(graphs: ForwardGraphs) -> str:
    """The buckets whose forwards replay a graph, "<smallest>..<largest>" tokens, with ":uncaptured" off
    CUDA; no spaces, as the start-up line is `key=value` pairs."""
    sizes = graphs.buckets.sizes
    return f"{sizes[0]}..{sizes[-1]}" + ("" if graphs.capture else ":uncaptured")
