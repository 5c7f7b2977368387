"""What a model kind is to the engine: the one protocol `ScoringEngine` holds, whatever the checkpoint.

A kind prepares jobs its way (its preparer), builds the forwards of a planned batch and runs one of
them into per-job score rows; everything else (validation of the seam, the token budget, the failure
bisection, results, ranking, provenance) is `ScoringEngine`'s and the same for every kind. The kinds are
chosen in one place (`choice.py`); adding one is a file implementing this protocol and one line there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs
    from kafka_scorer.engine.kinds.served import Served
    from kafka_scorer.engine.late_interaction.embedding_cache import EmbeddingCache
    from kafka_scorer.engine.load.start_up import StartUp
    from kafka_scorer.engine.pack.prefix_batch import PrefixPlanner
    from kafka_scorer.engine.prepare.prepared import InputLimits, PreparedJob
    from kafka_scorer.engine.run.runner import ModelRunner
    from kafka_scorer.wire.protocol import Job, Result, TemplateRef

Group = list[tuple[int, "PreparedJob"]]
"""One planned forward's pieces, each with its job's position in the batch."""


class Preparer(Protocol):
    """Job -> PreparedJob on the CPU; a job that needs no forward comes back as its Result, and bad
    input raises `InputError` (`engine/prepare/prepared.py`), answered by the engine."""

    @property
    def limits(self) -> InputLimits: ...
    def prepare(self, job: Job, job_id: str) -> PreparedJob | Result: ...
    def template_for(self, job: Job) -> TemplateRef | None: ...


@dataclass
class PieceScores:
    """What one forward gave one piece of a job: its rows (one per item or window), the pooled hidden
    states it asked for, and the prompt tokens a cache served."""

    index: int
    """The job's position in the batch."""
    rows: list[list[float]]
    hidden: torch.Tensor | None = None
    cached: int = 0
    cached_once: bool = False
    """A packed job counts its cached query once however many pieces repeat it (the largest, not the
    sum: `engine/pack/prefix_batch.py`'s `cached_tokens`)."""

    def add_cached(self, so_far: int) -> int:
        return max(so_far, self.cached) if self.cached_once else so_far + self.cached


class Kind(Protocol):
    """One model kind: decoder label scorer, decoder classifier, encoder cross-encoder, late
    interaction, vision-language (`choice.py` lists them)."""

    served: Served
    reads_images: bool
    """Whether jobs with content parts are prepared, or answered `unsupported` (SPEC §11)."""

    @property
    def preparer(self) -> Preparer: ...

    runner: ModelRunner
    """The device side the warm-up and the description read (label kernels, CUDA graphs)."""
    prefixes: PrefixPlanner | None
    embeddings: EmbeddingCache | None
    """Per-input vectors kept across jobs (a ColBERT document's, an image's features); None: off."""

    @property
    def graphs(self) -> ForwardGraphs | None: ...
    def forwards(self, groups: list[Group], backend: str) -> list[tuple[Group, Any]]:
        """The planned groups' forwards, built on the packing thread (any thread)."""
        ...

    def run(self, group: Group, forward: Any) -> list[PieceScores]:
        """One built forward on the device thread; raises on failure (the bisection isolates it)."""
        ...

    def finish(self, job: PreparedJob, rows: list[list[float]]) -> list[list[float]]:
        """A job's rows once all its pieces ran, before chunk aggregation and ranking."""
        ...

    def describe(self, common: dict[str, str], backend: str) -> dict[str, str]:
        """The start-up line's fields: the common ones, as this kind overrides them."""
        ...

    def warm_up(self, parts: StartUp, backend: str) -> str:
        """The start-up stage (`engine/load/warm_up.py`, or the kind's own) on the engine that starts
        on `backend`; returns the backend it serves with, which the engine keeps."""
        ...
