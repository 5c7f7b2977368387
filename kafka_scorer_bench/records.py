"""What one timed run of one contender produced, and the rule that picks which run is reported.

Shared by the in-process driver (`contenders.py`) and the Kafka client of (d) (`worker_contender.py`),
so both log submissions and answers the same way and hand `summary.py` the same record.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from kafka_scorer.wire.protocol import Result
from kafka_scorer_bench.probes import Measured

Scores = list[list[float]]


@dataclass
class RunRecord:
    """What one contender did on one workload; turned into the report's metrics by `summarise`."""

    scores: list[Scores | None]
    errors: list[str]
    latencies: list[float]
    wall_s: float
    forward_tokens: int
    """Tokens the contender ran through the model (padding included for the baseline)."""
    lm_head_rows: int
    """Rows that went through the full-vocabulary LM head."""
    peak_bytes: int
    foreign_cpu_load: float | None = None
    runs: int = 1
    submitted: list[float] = field(default_factory=list)
    """Per job, when it was submitted (`time.perf_counter`)."""
    answered_at: list[float] = field(default_factory=list)
    """Per job, when its answer arrived (0.0: never): what `steady.py` cuts the steady span from."""
    loop_cpu_s: float | None = None
    """(d) only: CPU time of the event loop's thread over the run (the worker's and the bench client's
    work there): what the device thread waits behind for the GIL."""


class RunLog:
    """Per-job submission times and answers of one closed-loop run, as they happen.

    A job's latency is its answer time minus its submission time.
    """

    def __init__(self, num_jobs: int) -> None:
        self.scores: list[Scores | None] = [None] * num_jobs
        self.errors = [""] * num_jobs
        self.submitted = [0.0] * num_jobs
        self.latencies = [0.0] * num_jobs
        self.answered_at = [0.0] * num_jobs

    def submit(self, index: int) -> None:
        self.submitted[index] = time.perf_counter()

    def answered(self, index: int) -> bool:
        return self.scores[index] is not None or bool(self.errors[index])

    def answer(self, index: int, scores: Scores | None, error: str | None, now: float) -> None:
        self.scores[index] = scores
        self.errors[index] = error or ""
        self.latencies[index] = now - self.submitted[index]
        self.answered_at[index] = now

    def record(self, wall_s: float, forward_tokens: int, lm_head_rows: int, measured: Measured) -> RunRecord:
        return RunRecord(
            scores=self.scores,
            errors=self.errors,
            latencies=self.latencies,
            wall_s=wall_s,
            forward_tokens=forward_tokens,
            lm_head_rows=lm_head_rows,
            peak_bytes=measured.peak_bytes,
            foreign_cpu_load=measured.foreign_cpu_load,
            submitted=self.submitted,
            answered_at=self.answered_at,
        )


def error_text(result: Result) -> str | None:
    """One form for every contender's error answers (code, then message): the report's `first_error`."""
    return None if result.error is None else f"{result.error.code.value}: {result.error.message}"


def fastest(records: Sequence[RunRecord]) -> RunRecord:
    """Noise on a shared machine only ever slows a run, so the fastest is the least disturbed."""
    best = min(records, key=lambda r: r.wall_s)
    best.runs = len(records)
    return best


def repeated(run: Callable[[int], RunRecord], repeats: int, budget_s: float) -> RunRecord:
    """Up to `repeats` runs while their total stays under `budget_s`; the fastest one."""
    records = [run(0)]
    while len(records) < repeats and sum(r.wall_s for r in records) < budget_s:
        records.append(run(len(records)))
    return fastest(records)


async def repeated_async(
    run: Callable[[int], Awaitable[RunRecord]], repeats: int, budget_s: float
) -> RunRecord:
    """`repeated` for runs that are coroutines (the Kafka client of (d))."""
    records = [await run(0)]
    while len(records) < repeats and sum(r.wall_s for r in records) < budget_s:
        records.append(await run(len(records)))
    return fastest(records)
