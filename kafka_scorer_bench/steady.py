"""Steady state for (d): a job stream long enough that filling and draining the pipeline are not the figure.

With a few CPU jobs the whole worker run is one or two batches, so what (d) measured was mostly fixed
costs paid once per run: the first fetch wait, the first batch close, the reply's fetch wait, and the
drain. Those are latency, not throughput. So the worker and, beside it, the engine on the very same
stream are timed over the middle of the run only:

- the stream is the workload's jobs cycled, long enough for `seconds` of the engine's measured time per
  job between a fill and a drain of one window each (`steady_stream`);
- the window of the closed loop also covers a round trip through the broker, so the worker never waits
  on the client's own fetches (`steady_window`);
- engine and worker take turns on it (`ROUNDS`), each reporting its steadiest run;
- throughput is the items answered after the first answer up to the last answer that came before the
  last submission, over that span (`steady_state`). Before it is the fill (first submission to first
  answer: the time to first result), after it the drain; both are reported, as latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.records import RunRecord

ROUND_TRIP_S = 0.5
"""Time a closed-loop client's window must also cover: produce, the worker's fetch wait, batch close, the
reply's fetch wait (tansu answers a waiting fetch only at its deadline, 100 ms each by default)."""

MAX_JOBS = 50_000
"""A ceiling on the stream, whatever the measured per-job time says (a fast GPU on tiny jobs)."""

QUICK_MAX_JOBS = 120
"""The ceiling with `--quick` (tests): enough for a span, small enough for a few seconds through Kafka."""

ROUNDS = 2
"""Engine and worker take turns this many times on the stream; each reports its steadiest run. Taking
turns, a slow spell of a shared machine or a drift over minutes (7% between two engine runs a minute
apart, measured on a quiet 2-core machine) hits both alike instead of one."""

SAME_BURST_S = 0.001
"""Answers this close together came back in one go (one `step`, one `getmany`): one event in time."""


@dataclass(frozen=True)
class SteadyStream:
    jobs: list[Job]
    window: int
    seconds: float
    """The steady span the stream was sized for, at the engine's measured time per job."""
    per_job_s: float


@dataclass
class SteadyState:
    """One run's steady span: which jobs were answered inside it, how long it lasted, and around it."""

    indices: list[int]
    """Jobs answered inside the span (after the first answer, up to the last answer before the last
    submission): the only jobs the steady figures count."""
    settled: list[int]
    """Of those, the jobs also submitted after the first answer: their latency is the steady state's,
    where the first window's jobs also waited through the fill."""
    span_s: float
    fill_s: float
    """First submission to first answer: the time to first result, pipeline fill included."""
    drain_s: float
    """End of the span to the last answer: the pipeline emptying once nothing more is submitted."""


def steady_window(window: int, per_job_s: float) -> int:
    """The contenders' window, widened to cover one round trip through the broker at the engine's pace."""
    return max(window, math.ceil(ROUND_TRIP_S / max(per_job_s, 1e-9)))


def steady_stream(
    jobs: Sequence[Job], per_job_s: float, window: int, seconds: float, max_jobs: int = MAX_JOBS
) -> SteadyStream:
    """The workload's jobs cycled: a fill and a drain of one window each around `seconds` of engine time.

    `per_job_s` is the engine's own measured wall time per job on this workload, so the stream lasts about
    as long on any device. Cycled jobs keep their shapes; their scores are the originals' (the
    cross-check maps job k of the stream to job k mod n of the workload). Under `max_jobs` the window
    shrinks to a third of it at most, so a span always remains.
    """
    window = max(1, min(steady_window(window, per_job_s), max_jobs // 3))
    middle = math.ceil(seconds / max(per_job_s, 1e-9))
    count = min(max_jobs, max(3 * window, 2 * window + middle))
    source = list(jobs)
    stream = [
        msgspec.structs.replace(source[k % len(source)], id=f"{source[k % len(source)].id}~{k}")
        for k in range(count)
    ]
    return SteadyStream(stream, window, seconds, per_job_s)


def steadiest(records: Sequence[RunRecord], jobs: Sequence[Job]) -> RunRecord:
    """The run with the most items per second in its steady span (a run without a span counts by its
    whole wall time): noise only ever slows a run."""

    def pace(record: RunRecord) -> float:
        state = steady_state(record)
        if state is None:
            return sum(len(job.items) for job in jobs) / max(record.wall_s, 1e-9)
        return sum(len(jobs[k].items) for k in state.indices) / state.span_s

    best = max(records, key=pace)
    best.runs = len(records)
    return best


def steady_state(record: RunRecord) -> SteadyState | None:
    """The steady span of one closed-loop run; None when there is none (the window held every job)."""
    answered = [t for t in record.answered_at if t > 0]
    if not answered or not record.submitted:
        return None
    start = min(record.submitted)
    last_submit = max(record.submitted)
    first = min(answered)
    before_last_submit = [t for t in answered if t <= last_submit]
    end = max(before_last_submit, default=first)
    if end - first <= SAME_BURST_S:
        return None
    indices = [k for k, t in enumerate(record.answered_at) if first + SAME_BURST_S < t <= end + SAME_BURST_S]
    settled = [k for k in indices if record.submitted[k] >= first]
    return SteadyState(
        indices=indices,
        settled=settled or indices,
        span_s=end - first,
        fill_s=first - start,
        drain_s=max(answered) - end,
    )
