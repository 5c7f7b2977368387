"""(d)'s steady state: the stream's size follows the engine's measured pace, and the timed span leaves
out the fill and the drain. Synthetic run records: no model, no broker, no timing."""

from __future__ import annotations

import math

import pytest

from kafka_scorer_bench.models import SHAPES
from kafka_scorer_bench.records import RunRecord
from kafka_scorer_bench.steady import (
    MAX_JOBS,
    ROUND_TRIP_S,
    steadiest,
    steady_state,
    steady_stream,
    steady_window,
)
from kafka_scorer_bench.summary import summarise_steady
from kafka_scorer_bench.workloads import Workload, build_workload, workload_spec


def _jobs(n: int = 3):
    return build_workload(workload_spec("rerank", quick=True, num_jobs=n), 512).jobs


def _closed_loop(batches: int, per_batch: int, window: int, batch_s: float, fill_s: float) -> RunRecord:
    """A closed loop as the contenders run it: `window` jobs submitted at 0, then each batch of
    `per_batch` answers (all at one instant) lets as many new jobs in, until the stream is used up."""
    n = batches * per_batch
    submitted = [0.0] * n
    answered = [0.0] * n
    sent = min(window, n)
    for b in range(batches):
        now = fill_s + b * batch_s
        for k in range(b * per_batch, (b + 1) * per_batch):
            answered[k] = now
        for k in range(sent, min(n, sent + per_batch)):
            submitted[k] = now
        sent = min(n, sent + per_batch)
    return RunRecord(
        scores=[[[0.5]]] * n,
        errors=[""] * n,
        latencies=[a - s for a, s in zip(answered, submitted)],
        wall_s=max(answered),
        forward_tokens=10 * n,
        lm_head_rows=0,
        peak_bytes=0,
        submitted=submitted,
        answered_at=answered,
    )


def test_span_starts_at_the_first_answer_and_ends_before_the_drain() -> None:
    # 10 batches of 4 jobs, window 8: batch 0 ends the fill at 5.0 s; the last submission comes with
    # batch 7's answers (9.2 s: jobs 36-39 go in), so batches 8 and 9 are the drain.
    record = _closed_loop(batches=10, per_batch=4, window=8, batch_s=0.6, fill_s=5.0)
    state = steady_state(record)
    assert state is not None
    assert state.fill_s == pytest.approx(5.0)  # the first result, not counted in the span
    assert state.span_s == pytest.approx(7 * 0.6)
    assert state.drain_s == pytest.approx(2 * 0.6)
    assert state.indices == list(range(4, 32))  # batches 1..7: not the first, not the drain


def test_steady_summary_counts_the_span_only() -> None:
    record = _closed_loop(batches=10, per_batch=4, window=8, batch_s=0.5, fill_s=30.0)
    jobs = _jobs(40)
    summary = summarise_steady(
        "x", record, Workload(workload_spec("rerank", quick=True), jobs), SHAPES["tiny"], 1e9
    )
    items = sum(len(jobs[k].items) for k in range(4, 32))
    # A 30 s fill would swamp a whole-run figure; the steady one is the batches' pace alone.
    assert summary.items_per_s == pytest.approx(items / (7 * 0.5))
    assert summary.steady == {
        "stream_jobs": 40,
        "span_jobs": 28,
        "span_s": pytest.approx(3.5),
        "fill_s": pytest.approx(30.0),
        "drain_s": pytest.approx(1.0),
    }
    assert summary.latency_p99_s < 30.0  # latencies of the span's jobs, not the fill's


def test_the_steadiest_turn_is_reported_not_the_shortest() -> None:
    """A turn with a quick fill but slower batches is shorter overall; the figure is the steady pace."""
    quick_fill = _closed_loop(batches=10, per_batch=4, window=8, batch_s=0.6, fill_s=0.1)
    fast_batches = _closed_loop(batches=10, per_batch=4, window=8, batch_s=0.5, fill_s=5.0)
    assert quick_fill.wall_s < fast_batches.wall_s
    best = steadiest([quick_fill, fast_batches], _jobs(40))
    assert best is fast_batches and best.runs == 2


def test_no_span_when_the_window_holds_every_job() -> None:
    record = _closed_loop(batches=2, per_batch=4, window=8, batch_s=0.5, fill_s=1.0)
    assert steady_state(record) is None
    summary = summarise_steady(
        "x", record, Workload(workload_spec("rerank", quick=True), _jobs(8)), SHAPES["tiny"], 1e9
    )
    assert summary.steady is None and summary.wall_s == record.wall_s


@pytest.mark.parametrize(
    ("per_job_s", "seconds", "window"), [(0.5, 20.0, 13), (0.002, 20.0, 13), (1.7, 20.0, 5)]
)
def test_stream_is_sized_from_the_engines_pace(per_job_s: float, seconds: float, window: int) -> None:
    stream = steady_stream(_jobs(3), per_job_s, window, seconds)
    assert stream.window == max(window, math.ceil(ROUND_TRIP_S / per_job_s))
    middle = math.ceil(seconds / per_job_s)
    assert len(stream.jobs) == min(MAX_JOBS, max(3 * stream.window, 2 * stream.window + middle))
    # Long enough that a fill and a drain of one window each leave `seconds` of engine time between them.
    assert (len(stream.jobs) - 2 * stream.window) * per_job_s >= seconds or len(stream.jobs) == MAX_JOBS


def test_stream_cycles_the_workload_with_unique_ids() -> None:
    jobs = _jobs(3)
    stream = steady_stream(jobs, 0.1, 4, 2.0)
    assert len({j.id for j in stream.jobs}) == len(stream.jobs)
    for k, job in enumerate(stream.jobs):
        source = jobs[k % 3]
        assert (job.query, job.items, job.label_token_ids) == (
            source.query,
            source.items,
            source.label_token_ids,
        )


def test_a_capped_stream_keeps_a_span() -> None:
    stream = steady_stream(_jobs(3), 0.001, 13, 20.0, max_jobs=120)
    assert len(stream.jobs) == 120 and stream.window == 40  # fill and drain take two thirds at most


def test_window_covers_a_round_trip() -> None:
    assert steady_window(13, 0.5) == 13  # slow engine: two budgets already outlast a round trip
    assert steady_window(13, 0.001) == math.ceil(ROUND_TRIP_S / 0.001)
