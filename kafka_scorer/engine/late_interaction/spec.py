"""What a loaded ColBERT checkpoint is, for the engine: its settings, projection and special token ids,
carried by `LateModel` (the `LoadedModel` fields and this), which its loader (`loading.py`) builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka_scorer.engine.late_interaction.checkpoint import ColbertSettings, Projection
from kafka_scorer.engine.models.loaded import LoadedModel


@dataclass(frozen=True)
class LateSpec:
    """Everything the engine needs to encode and score like the checkpoint."""

    settings: ColbertSettings
    projection: Projection
    """The Dense modules, on the model's device and dtype."""
    lead: tuple[int, ...]
    """Special tokens before a text ([CLS]); the marker goes right after them."""
    tail: tuple[int, ...]
    """Special tokens after a text ([SEP])."""
    query_marker: tuple[int, ...]
    document_marker: tuple[int, ...]
    expansion_id: int
    """The token a query is padded with up to `query_length` (the mask token)."""
    skiplist_ids: frozenset[int]
    takes_token_types: bool

    @property
    def dim(self) -> int:
        return self.projection.dim


@dataclass
class LateModel(LoadedModel):
    """A loaded late-interaction (ColBERT) checkpoint: the `LoadedModel` fields and its `LateSpec`."""

    late: LateSpec = field(kw_only=True)
