"""What the warm-up and the description read of a built Scorer, declared once as a protocol.

They run on a whole engine (every part loaded), yet the Scorer calls them: importing the Scorer class
here would tie load/ and the seam into a circle. So they name only the members they use, `Scorer`
satisfies this structurally, and mypy checks it where the Scorer hands itself over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs
    from kafka_scorer.engine.models.loaded import LoadedModel, ModelKind
    from kafka_scorer.engine.pack.batch import ForwardBatch
    from kafka_scorer.engine.prepare.prepared import InputLimits, PreparedJob
    from kafka_scorer.engine.prepare.templates import PromptTemplate
    from kafka_scorer.engine.run.runner import BatchOutput, ModelRunner
    from kafka_scorer.wire.protocol import Job, Result


class ScorerView(Protocol):
    loaded: LoadedModel
    attention_backend: str
    """Set by the warm-up's fallbacks when an automatic backend fails at the model's shapes."""
    max_batch_tokens: int
    deterministic: bool
    revision: str
    template: PromptTemplate | None

    @property
    def model_name(self) -> str: ...
    @property
    def kind(self) -> ModelKind: ...
    @property
    def dtype_name(self) -> str: ...
    @property
    def limits(self) -> InputLimits: ...
    @property
    def graphs(self) -> ForwardGraphs | None: ...
    @property
    def runner(self) -> ModelRunner: ...
    @property
    def auto_backend(self) -> bool: ...
    @property
    def prefix_cache_capacity_mb(self) -> float: ...

    def prepare(self, job: Job, job_id: str) -> PreparedJob | Result: ...
    def run_forward(self, batch: ForwardBatch) -> BatchOutput: ...
    def score_jobs(self, jobs: Sequence[Job]) -> list[Result]: ...
    def forget_prefixes(self) -> None: ...
