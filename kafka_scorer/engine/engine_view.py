"""What tests, the bench and the demo read of a built engine, in one record: `ScoringEngine.describe()`.

The engine's parts (its loaded model, its kind, its runner and graphs) and its counters used to be a
dozen public attributes of the Scorer, beside the calls that serve; here they are one snapshot that
nothing writes back, so the engine's surface stays the few calls its callers make.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs, GraphStats
    from kafka_scorer.engine.kinds.kind import Kind
    from kafka_scorer.engine.models.loaded import LoadedModel
    from kafka_scorer.engine.pack.embedding_cache import EmbeddingCacheStats
    from kafka_scorer.engine.pack.prefix_cache import PrefixCacheStats
    from kafka_scorer.engine.run.runner import ModelRunner


@dataclass(frozen=True)
class EngineView:
    model_name: str
    loaded: LoadedModel
    kind: Kind
    """The model kind the engine holds (`engine/kinds/`): its preparer, its served settings."""
    runner: ModelRunner
    graphs: ForwardGraphs | None
    attention_backend: str
    """The backend forwards are built with now (after the warm-up's fallbacks)."""
    fields: dict[str, str]
    """The start-up line's fields (`engine/load/description.py`, as the kind overrides them)."""
    prefix_cache: PrefixCacheStats | None
    """The prefix cache's counters; None when it is off."""
    embedding_cache: EmbeddingCacheStats | None
    """The kind's embedding cache's counters; None when it has none or it is off."""
    cuda_graphs: GraphStats | None
    """The CUDA graphs' counters; None when none are captured."""
