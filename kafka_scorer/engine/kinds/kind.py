"""What a model kind is to the engine: the one protocol `ScoringEngine` holds, whatever the checkpoint.

A kind prepares jobs its way (its preparer), builds the forwards of a planned batch and runs one of
them into per-job score rows; everything else (validation of the seam, the token budget, the failure
bisection, results, ranking, provenance) is `ScoringEngine`'s and the same for every kind. The kinds are
chosen in one place (`choice.py`) from the checkpoint's files, before any weight loads; adding one is a
file implementing `KindClass` and this protocol, and one line there.

Each kind's forwards are typed by the kind (`OwnForwards[P, F]`: the prepared jobs its preparer makes,
the forward it builds); the engine, which holds any kind, sees a built forward only as `Built`, a thing
to run on the device thread, so no `Any` and no cast crosses the seam.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import torch

    from kafka_scorer.engine.config import EngineConfig
    from kafka_scorer.engine.kinds.served import Served
    from kafka_scorer.engine.load.checkpoint import Checkpoint
    from kafka_scorer.engine.load.start_up import StartUp
    from kafka_scorer.engine.pack.embedding_cache import EmbeddingCache, EmbeddingCacheStats
    from kafka_scorer.engine.pack.prefix_batch import PrefixPlanner
    from kafka_scorer.engine.pack.prefix_cache import PrefixCacheStats
    from kafka_scorer.engine.prepare.prepared import InputLimits, PreparedJob
    from kafka_scorer.engine.run.runner import ModelRunner
    from kafka_scorer.wire.protocol import Job, Result, TemplateRef

P = TypeVar("P", bound="PreparedJob")
"""A kind's prepared job (`PreparedJob`, or the kind's own: `LateJob`, `VisionJob`, `ListwiseJob`)."""
F = TypeVar("F")
"""A kind's built forward (`ForwardBatch`, `LateForward`, ...)."""

Pieces = list[tuple[int, P]]
"""One planned forward's pieces, each with its job's position in the batch."""
Group = list[tuple[int, "PreparedJob"]]
"""`Pieces` as the engine plans them, of any kind."""


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
    """The device side the warm-up and the description read (label kernels, its CUDA graphs)."""

    def build(self, groups: list[Group], backend: str) -> list[Built]:
        """The planned groups' forwards, built on the packing thread (any thread)."""
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

    def cache_stats(self) -> CacheStats:
        """The counters of what the kind keeps across jobs (`KeptAcrossJobs`)."""
        ...

    def forget(self) -> None:
        """Empty what the kind keeps across jobs: the warm-up's inputs are no traffic's."""
        ...


@dataclass(frozen=True)
class CacheStats:
    prefix: PrefixCacheStats | None
    """The prefix cache's counters; None when it is off or cannot be exact for the model."""
    embedding: EmbeddingCacheStats | None
    """The embedding cache's counters; None when the kind keeps none or it is off."""


class KeptAcrossJobs:
    """What a kind keeps from one job to the next, behind the two calls the engine makes of it.

    The prefix cache's heads (a decoder's shared query, `engine/pack/prefix_batch.py`) and the embedding
    cache's vectors (a ColBERT document's, an image's features, `engine/pack/embedding_cache.py`) are the
    kind's own: the engine reads their counters for /metrics and empties them after the warm-up, and
    reaches nothing else of them. A kind sets the one it keeps; None: it keeps none, or it is off."""

    prefixes: PrefixPlanner | None = None
    embeddings: EmbeddingCache | None = None

    def cache_stats(self) -> CacheStats:
        prefixes, embeddings = self.prefixes, self.embeddings
        return CacheStats(
            prefixes.cache.stats() if prefixes is not None else None,
            embeddings.stats() if embeddings is not None else None,
        )

    def forget(self) -> None:
        if self.prefixes is not None:
            self.prefixes.cache.clear()
        if self.embeddings is not None:
            self.embeddings.clear()


class KindClass(Protocol):
    """A kind as the selector knows it (`choice.py`): whether it serves a checkpoint, read from its
    files alone, and how it opens it (loads its weights its own way, then is the `Kind` serving them)."""

    def claims(self, checkpoint: Checkpoint) -> bool: ...
    def open(self, config: EngineConfig, checkpoint: Checkpoint) -> Kind: ...


@dataclass(frozen=True)
class Built:
    """One forward a kind built, as the engine holds it until the device thread runs it."""

    forward: object
    """What the kind built (a `ForwardBatch` for the text kinds): for tests and the bench to look at."""
    run: Callable[[], list[PieceScores]]
    """Run it on the device thread; raises on failure (the bisection isolates it)."""


class OwnForwards(ABC, Generic[P, F]):
    """A kind's forwards typed by the kind: it builds and runs its own prepared jobs (`job_type`, what
    its preparer makes) into its own forward type; `build` and `finish` are what the engine calls."""

    job_type: type[P]

    def build(self, groups: list[Group], backend: str) -> list[Built]:
        own = [[(index, self._own(job)) for index, job in group] for group in groups]
        return [
            Built(forward, functools.partial(self.run, pieces, forward))
            for pieces, forward in self.forwards(own, backend)
        ]

    def finish(self, job: PreparedJob, rows: list[list[float]]) -> list[list[float]]:
        return self.finish_own(self._own(job), rows)

    @abstractmethod
    def forwards(self, groups: list[Pieces[P]], backend: str) -> list[tuple[Pieces[P], F]]:
        """The groups' forwards; a kind may reorder them or add forwards of no piece (the prefix
        cache's heads), each with the pieces it scores."""

    @abstractmethod
    def run(self, pieces: Pieces[P], forward: F) -> list[PieceScores]:
        """One built forward on the device thread."""

    def finish_own(self, job: P, rows: list[list[float]]) -> list[list[float]]:
        """A job's rows once all its pieces ran (unchanged unless the kind says otherwise)."""
        return rows

    def _own(self, job: PreparedJob) -> P:
        if not isinstance(job, self.job_type):
            raise TypeError(
                f"{type(self).__name__} runs the {self.job_type.__name__}s its preparer makes, not {job!r}"
            )
        return job
