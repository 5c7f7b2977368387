"""What the start-up stage (the warm-up, its fallbacks, the description) may use of a built engine.

Narrow capabilities, not the engine itself: the loaded model and its device side to look at, and three
calls (score jobs with a named attention backend, prepare one job, empty the kind's caches). The stage
returns what it chose (the attention backend a fallback settled on) and the engine keeps it, so no
module below the engine writes the engine's attributes, and load/ imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs
    from kafka_scorer.engine.models.loaded import LoadedModel
    from kafka_scorer.engine.prepare.prepared import InputLimits, PreparedJob
    from kafka_scorer.engine.run.runner import ModelRunner
    from kafka_scorer.wire.protocol import Job, Result


@dataclass(frozen=True)
class StartUp:
    loaded: LoadedModel
    runner: ModelRunner
    graphs: ForwardGraphs | None
    limits: InputLimits
    max_batch_tokens: int
    auto_backend: bool
    """Whether the engine chose the attention backend (only then may a fallback replace it)."""
    score_jobs: Callable[[Sequence[Job], str], list[Result]]
    """Jobs scored end to end with the attention backend named: the warm-up's batches, each retry."""
    prepare: Callable[[Job, str], PreparedJob | Result]
    forget: Callable[[], None]
    """Empty what the kind keeps across jobs (its prefix or embedding cache): the warm-up's inputs are
    no traffic's."""
