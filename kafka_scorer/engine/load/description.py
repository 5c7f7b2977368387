"""What an engine serves and how, as plain strings: the worker's start-up line and its info metric."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs
    from kafka_scorer.engine.load.start_up import StartUp


@dataclass(frozen=True)
class Settled:
    """What the engine settled at load (beside what the start-up stage reads of it), for the line."""

    dtype: str
    deterministic: bool
    revision: str
    template: str
    """The template's name, or "" for none."""
    prefix_cache_mb: float


def describe(parts: StartUp, backend: str, settled: Settled) -> dict[str, str]:
    loaded, graphs = parts.loaded, parts.graphs
    return {
        "model": loaded.name,
        "kind": loaded.architecture.value,
        "device": str(loaded.device),
        "dtype": settled.dtype,
        "dtype_reason": loaded.dtype_reason,
        "attention_backend": backend,
        "deterministic": str(settled.deterministic).lower(),
        "decoder_forward": _decoder_forward(parts),
        "label_kernels": parts.runner.label_kernels,
        "max_batch_tokens": str(parts.max_batch_tokens),
        "max_pair_tokens": str(parts.limits.max_pair_tokens),
        "revision": settled.revision,
        "template": settled.template,
        "prefix_cache_mb": f"{settled.prefix_cache_mb:g}",
        "cuda_graphs": _graphs(graphs) if graphs is not None and graphs.ready else "off",
    }


def _decoder_forward(parts: StartUp) -> str:
    """fused-compiled, fused-eager (as asked, or after the warm-up found compiling broken), or the
    checkpoint's own body class (transformers' layers, an encoder)."""
    from kafka_scorer.engine.models.decoder import FusedDecoder

    body = parts.loaded.body
    if isinstance(body, FusedDecoder):
        return "fused-compiled" if body.regions.compiled else "fused-eager"
    return type(body).__name__


def _graphs(graphs: ForwardGraphs) -> str:
    """The buckets whose forwards replay a graph, "<smallest>..<largest>" tokens, with ":uncaptured" off
    CUDA; no spaces, as the start-up line is `key=value` pairs."""
    sizes = graphs.buckets.sizes
    return f"{sizes[0]}..{sizes[-1]}" + ("" if graphs.capture else ":uncaptured")
