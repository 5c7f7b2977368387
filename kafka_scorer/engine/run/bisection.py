"""Running a failed batch again in halves until the job that breaks it stands alone.

A forward pass that raises usually fails for one odd job, not for the batch: the batch runs again in
halves, recursively, so its batch-mates are scored and only the job that breaks it alone is answered
`internal` (engine/failures.py decides what an error means). Out of memory frees the device's cache
first; one job that still does not fit alone is a device too small for the settings, which is fatal.
Errors that poison the device are raised at once: the worker must stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from kafka_scorer.engine.failures import FatalDeviceError, is_fatal, is_out_of_memory
from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.wire.protocol import Result

log = logging.getLogger(__name__)

B = TypeVar("B")  # the engine's packed batch


@dataclass(frozen=True)
class Bisection(Generic[B]):
    """What bisecting needs of the engine: pack jobs, run a packed batch once (raising), free device
    memory, and answer one job that breaks the forward."""

    pack: Callable[[Sequence[PreparedJob]], B]
    run_once: Callable[[B], list[Result]]
    free_memory: Callable[[], None]
    answer_failed: Callable[[PreparedJob, Exception], list[Result]]

    def run(self, jobs: list[PreparedJob], packed: B) -> list[Result]:
        """The batch's results; a failure is isolated to the job that causes it."""
        try:
            return self.run_once(packed)
        except Exception as exc:  # the engine's one guard around forwards: isolates the job that breaks it
            return self.after_failure(jobs, exc)

    def after_failure(self, jobs: list[PreparedJob], exc: Exception) -> list[Result]:
        if is_fatal(exc):
            raise exc
        if is_out_of_memory(exc):
            self.free_memory()
        if len(jobs) > 1:
            name = type(exc).__name__
            log.warning("forward pass failed for %d jobs (%s: %s); retrying in halves", len(jobs), name, exc)
            front, back = jobs[: len(jobs) // 2], jobs[len(jobs) // 2 :]
            return self.run(front, self.pack(front)) + self.run(back, self.pack(back))
        job = jobs[0]
        if is_out_of_memory(exc):  # alone, with the cache freed: one more try, then the device is too small
            try:
                return self.run_once(self.pack(jobs))
            except Exception as again:  # the retry alone, classified like the first failure
                if is_out_of_memory(again):
                    raise FatalDeviceError(
                        f"out of memory on one job of {job.num_tokens} tokens after freeing the cache: "
                        "lower max_batch_tokens or max_pair_tokens, or use a larger device"
                    ) from again
                return self.after_failure(jobs, again)
        log.error(
            "job %s breaks the forward pass (%s: %s); answered internal", job.job_id, type(exc).__name__, exc
        )
        return self.answer_failed(job, exc)
