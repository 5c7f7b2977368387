"""The engine as the worker sees it: prepare -> pack -> run, declared once (`ScoringEngine` in
engine/scoring_engine.py is the implementation; the worker's unit tests use a fake of the same shape).

Typed over the engine's own prepared-job and packed-batch types, so the worker hands back exactly what
the engine gave it and never looks inside: the worker knows nothing of tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from kafka_scorer.wire.engine_stats import EngineStats
from kafka_scorer.wire.protocol import Job, Result
from kafka_scorer.wire.provenance import ServedModel


class Prepared(Protocol):
    """What the worker reads of a prepared job: its id and its exact token count (the budget's unit)."""

    @property
    def job_id(self) -> str: ...

    @property
    def num_tokens(self) -> int: ...


P = TypeVar("P", bound=Prepared)  # the engine's prepared job
B = TypeVar("B")  # the engine's packed batch


class Engine(Protocol[P, B]):
    """prepare (CPU, any thread), pack (CPU, the pack thread), run_packed (the device thread).

    None of them raises for a bad job: the engine answers it with an error `Result` itself. What does
    raise is a bug, or a `FatalError` (the device can no longer be trusted)."""

    @property
    def served(self) -> ServedModel: ...

    @property
    def max_batch_tokens(self) -> int:
        """The engine's token budget of one forward: the worker's batches are closed at it."""
        ...

    def prepare(self, job: Job, job_id: str) -> P | Result: ...

    def pack(self, jobs: Sequence[P]) -> B: ...

    def run_packed(self, packed: B) -> list[Result]: ...

    def stats(self) -> EngineStats:
        """The engine's counters now (caches, CUDA graphs), read by the worker's /metrics at each scrape."""
        ...
