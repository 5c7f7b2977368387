"""When a job was born and when it expires: the one-sided clock rule of worker/deadline.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafka_scorer.worker.deadline import TimePolicy, born_at

NOW_WALL_MS = 1_800_000_000_000.0
NOW = 500.0  # monotonic


def test_a_past_timestamp_is_that_long_ago_on_the_monotonic_clock() -> None:
    assert born_at(int(NOW_WALL_MS) - 1500, NOW_WALL_MS, NOW) == NOW - 1.5


@given(st.one_of(st.none(), st.integers(-(2**63), -1), st.integers(int(NOW_WALL_MS) + 1, 2**63 - 1)))
def test_a_missing_or_future_timestamp_is_received_now(timestamp) -> None:
    """A producer clock running ahead (or no timestamp) never makes a job look older than it is."""
    assert born_at(timestamp, NOW_WALL_MS, NOW) == NOW


@given(st.integers(0, 2**40), st.one_of(st.none(), st.integers(1, 2**31)), st.integers(0, 2**31))
def test_the_deadline_is_the_jobs_timeout_else_the_workers_max_age(born_ms, timeout_ms, max_age_ms) -> None:
    born = born_ms / 1000
    deadline = TimePolicy(max_job_age_ms=max_age_ms).deadline(born, timeout_ms)
    limit = timeout_ms or max_age_ms
    assert deadline == (born + limit / 1000 if limit else None)


def test_the_priority_is_the_jobs_else_its_topics() -> None:
    policy = TimePolicy(topic_priorities={"bulk": -2})
    assert policy.priority("bulk", None) == -2
    assert policy.priority("bulk", 7) == 7
    assert policy.priority("other", None) == 0
