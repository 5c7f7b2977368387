"""The settings every kind is built with, resolved once against the loaded checkpoint.

The pair limit is the model's positions unless the operator set a smaller one; the token budget the
device's default unless set; the attention backend the device's choice unless named, or deterministic
mode's (which also decides whether the prefix cache can stay exact); the template read once. A kind
takes what applies to it (`kind.py`); the engine reads the same record for what it reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from kafka_scorer.engine.attention.registry import choose_attention_backend
from kafka_scorer.engine.config import EngineConfig, default_batch_tokens
from kafka_scorer.engine.load.deterministic import keeps_prefix_cache, make_deterministic
from kafka_scorer.engine.models.loaded import LoadedModel
from kafka_scorer.engine.pack.embedding_cache import EmbeddingCache, embedding_capacity_bytes
from kafka_scorer.engine.prepare.prepared import InputLimits
from kafka_scorer.engine.prepare.templates import PromptTemplate, load_template
from kafka_scorer.wire.protocol import parse_chunking

DEFAULT_PAIR_LIMIT = 32768
"""A pair's token limit for a model whose config names no positions."""


@dataclass(frozen=True)
class Served:
    loaded: LoadedModel
    config: EngineConfig
    limits: InputLimits
    template: PromptTemplate | None
    attention_backend: str
    """The backend forwards start with; the engine keeps the one the warm-up returns (its fallbacks)."""
    auto_backend: bool
    """Whether the engine chose the backend (and the warm-up may change it)."""
    max_batch_tokens: int
    revision: str
    prefix_cache_mb: int
    """The setting, or 0 where deterministic mode's backend cannot keep cached heads exact."""

    @property
    def dtype_name(self) -> str:
        return str(self.loaded.dtype).removeprefix("torch.")

    def embedding_cache(self) -> EmbeddingCache | None:
        """A kind's cache of per-input vectors (a ColBERT document's, an image's features) under
        `embedding_cache_mb`, keyed by the revision and dtype that computed them; None when off."""
        capacity = embedding_capacity_bytes(self.config.embedding_cache_mb)
        return EmbeddingCache(capacity, (self.revision, self.dtype_name)) if capacity > 0 else None


def serve(loaded: LoadedModel, config: EngineConfig) -> Served:
    """The common settings of `config` resolved for `loaded` (deterministic mode applied to its body)."""
    model_limit = loaded.max_positions or DEFAULT_PAIR_LIMIT
    chunking = config.chunking
    limits = InputLimits(
        max_items_per_job=config.max_items_per_job,
        max_pair_tokens=min(config.max_pair_tokens, model_limit) if config.max_pair_tokens else model_limit,
        truncate=config.truncate,
        max_labels_per_job=config.max_labels_per_job,
        chunking=parse_chunking(chunking) if isinstance(chunking, str) else chunking,
        max_chunks_per_job=config.max_chunks_per_job,
    )
    auto = config.attention_backend == "auto"
    backend = config.attention_backend
    prefix_cache_mb = config.prefix_cache_mb
    if config.deterministic:  # engine/load/deterministic.py: fixed-shape blocks, the mode's attention
        backend = make_deterministic(loaded, config.attention_backend)
        if not keeps_prefix_cache(backend):
            prefix_cache_mb = 0
    elif auto:  # the mode picks its own (no flex probe for it)
        backend = choose_attention_backend(loaded.device)
    return Served(
        loaded=loaded,
        config=config,
        limits=limits,
        template=load_template(config.template),
        attention_backend=backend,
        auto_backend=auto,
        max_batch_tokens=config.max_batch_tokens or default_batch_tokens(loaded.device.type),
        revision=config.model_revision or loaded.revision,
        prefix_cache_mb=prefix_cache_mb,
    )


class LoadOptions(TypedDict):
    """The keyword arguments every kind's loader takes."""

    served_name: str | None
    dtype: str
    device: str
    trust_remote_code: bool


def load_options(config: EngineConfig) -> LoadOptions:
    return LoadOptions(
        served_name=config.served_model_name,
        dtype=config.dtype,
        device=config.device,
        trust_remote_code=config.trust_remote_code,
    )
