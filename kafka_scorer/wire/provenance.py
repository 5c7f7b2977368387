"""What a worker serves, and the one place a result is stamped with it (SPEC §8 provenance).

The engine builds a `ServedModel` once it has loaded the checkpoint (`ScoringEngine.served`); the engine
stamps every result it computes with it, and delivery stamps the results the worker made without the
engine (an undecodable record, a result too large to produce) with the same record, so every answer
says which checkpoint, dtype and template it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kafka_scorer.wire.protocol import Result, TemplateRef


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The served model as the worker sees it: no tensors, no engine types."""

    name: str
    revision: str = ""
    dtype: str = ""
    description: Mapping[str, str] = field(default_factory=dict)
    """Everything worth one start-up line and the info metric (kind, device, backend, limits ...)."""

    def stamp(self, result: Result, template: TemplateRef | None = None) -> Result:
        """Provenance on `result` (in place; returned for chaining): which checkpoint, dtype and, for
        a templated job, which template produced it. A result already stamped keeps its stamp."""
        if result.model_revision:
            return result
        result.model = result.model or self.name
        result.model_revision = self.revision
        result.dtype = self.dtype
        if template is not None:
            result.template = template
        return result
