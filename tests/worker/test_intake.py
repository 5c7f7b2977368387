"""Intake with the engine, the batcher's device and the broker faked: one slow prepare holds back nobody
else, a revoked partition's late prepare is dropped, nothing raised on the way leaves a ticket unsettled,
and a record whose reading raises is answered, not fatal.

The real thing on a broker is tests/integration/test_poison.py; these pin the bookkeeping exactly.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
from aiokafka import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_scorer.wire.protocol import ErrorCode, Result
from kafka_scorer.worker.batcher import Batcher
from kafka_scorer.worker.deadline import TimePolicy
from kafka_scorer.worker.envelope import RecordCodec
from kafka_scorer.worker.intake import Intake
from kafka_scorer.worker.ledger import Ledger
from kafka_scorer.worker.outbox import Outbox
from kafka_scorer.worker.ticket import Ticket
from kafka_scorer.worker.tracing import Tracing
from tests.worker.conftest import FakeEngine, Rec, until

TP0, TP1 = TopicPartition("jobs", 0), TopicPartition("jobs", 1)
CODEC = RecordCodec("results", lambda topic: f"{topic}.DLT", 1 << 20, "fake")


class RecordingDelivery:
    """Answers every ticket at once, as an acknowledged produce would."""

    def __init__(self) -> None:
        self.answered: list[Result] = []

    async def deliver(self, tickets: list[Ticket[Any]]) -> None:
        for ticket in tickets:
            assert ticket.result is not None
            self.answered.append(ticket.result)
            done = ticket.watermark.answered(ticket.offset)
            ticket.settle(ticket.result if done else None)


class BrokenBatcher(Batcher):
    def add(self, ticket) -> None:
        raise RuntimeError("queue broken")


def _intake(ledger: Ledger, engine: FakeEngine, broken_queue: bool = False) -> tuple[Intake, Outbox]:
    outbox = Outbox()
    outbox.delivery = RecordingDelivery()  # type: ignore[assignment]
    kind = BrokenBatcher if broken_queue else Batcher
    batcher = kind(engine, lambda done: None, max_batch_tokens=100, max_batch_wait_ms=60_000)
    return Intake(engine, ledger, batcher, outbox, CODEC, Tracing(None)), outbox


def _rec(partition: int, offset: int, job_id: str, **fields: object) -> Rec:
    job = {"id": job_id, "query": [1], "items": [[2]], "label_token_ids": [1], **fields}
    timestamp = int(time.time() * 1000) - 1000  # produced a second ago
    return Rec(msgspec.json.encode(job), partition=partition, offset=offset, timestamp=timestamp)


def _queued(intake: Intake) -> list[str]:
    return [t.job_id for t in intake.batcher._scheduler._queue]


@pytest.fixture
def engine():
    engine = FakeEngine()
    yield engine
    engine.gate.set()


async def test_a_slow_prepare_holds_back_no_other_job_in_its_poll_or_later_polls(ledger, engine) -> None:
    intake, _ = _intake(ledger, engine)
    await intake.accept({TP0: [_rec(0, 0, "slow-0")], TP1: [_rec(1, 0, "fast-0")]})
    await intake.accept({TP1: [_rec(1, 1, "fast-1")]})
    await until(lambda: _queued(intake) == ["fast-0", "fast-1"])
    assert ledger.jobs == 3  # the slow one is still in flight, and counted
    assert ledger.tracker.watermark(TP0).commit_offset() == 0  # no commit passes the slow record
    engine.gate.set()
    await until(lambda: "slow-0" in _queued(intake))
    assert ledger.tokens == 9
    intake.close()


async def test_a_prepare_finishing_after_its_partition_was_revoked_is_dropped(ledger, engine) -> None:
    intake, outbox = _intake(ledger, engine)
    await intake.accept({TP0: [_rec(0, 0, "slow-0")]})
    ledger.tracker.revoke([TP0])
    engine.gate.set()
    await until(lambda: ledger.jobs == 0)
    assert _queued(intake) == [] and outbox.delivery.answered == []  # type: ignore[union-attr]
    assert ledger.metrics.dropped._value.get() == 1
    intake.close()


@pytest.mark.parametrize(
    ("job_id", "broken_queue", "needle"), [("boom-0", False, "prepare failed"), ("ok-0", True, "queueing")]
)
async def test_an_exception_in_prepare_or_queueing_is_the_jobs_internal_answer(
    ledger, engine, job_id, broken_queue, needle
) -> None:
    intake, outbox = _intake(ledger, engine, broken_queue)
    await intake.accept({TP0: [_rec(0, 0, job_id)], TP1: [_rec(1, 0, "fine")]})
    await until(lambda: ledger.jobs == (1 if not broken_queue else 0))
    failed = [r for r in outbox.delivery.answered if r.id == job_id]  # type: ignore[union-attr]
    assert len(failed) == 1 and failed[0].error is not None
    assert failed[0].error.code is ErrorCode.INTERNAL and needle in failed[0].error.message
    assert ledger.tracker.watermark(TP0).commit_offset() == 1  # answered, so committable
    intake.close()


class Exploding(Rec):
    """A record whose headers raise when read: the codec cannot cope, so intake's guard must."""

    @property
    def headers(self):  # type: ignore[override]
        raise RuntimeError("boom")

    @headers.setter
    def headers(self, _value) -> None:
        pass


async def test_a_record_whose_reading_raises_is_answered_internal_and_the_rest_go_on(ledger, engine) -> None:
    """Second line of defence: a bug at the edge answers that record alone `internal` on the default
    reply topic (nothing of the record is trusted), and the records after it are read as usual."""
    intake, outbox = _intake(ledger, engine)
    await intake.accept({TP0: [Exploding(b"{}", partition=0, offset=0), _rec(0, 1, "b")]})
    await until(lambda: len(outbox.delivery.answered) == 1)  # type: ignore[union-attr]
    (result,) = outbox.delivery.answered  # type: ignore[union-attr]
    assert result.id == "jobs:0:0" and result.error is not None
    assert result.error.code is ErrorCode.INTERNAL and "boom" in result.error.message
    assert _queued(intake) == ["b"]
    assert ledger.tracker.watermark(TP0).commit_offset() == 1
    intake.close()


async def test_a_job_expired_when_read_is_answered_deadline_exceeded_without_being_prepared(
    ledger, engine
) -> None:
    """Produced a second ago with a 500 ms timeout: answered at once, never prepared nor queued; the
    job beside it with time to spare goes on. The priority the metric is labelled with is the job's."""
    intake, outbox = _intake(ledger, engine)
    late = _rec(0, 0, "late", timeout_ms=500, priority=3)
    await intake.accept({TP0: [late, _rec(0, 1, "fresh", timeout_ms=60_000)]})
    await until(lambda: len(outbox.delivery.answered) == 1)  # type: ignore[union-attr]
    (result,) = outbox.delivery.answered  # type: ignore[union-attr]
    assert result.id == "late" and result.error is not None
    assert result.error.code is ErrorCode.DEADLINE_EXCEEDED
    await until(lambda: _queued(intake) == ["fresh"])
    assert engine.prepared == ["fresh"]
    assert ledger.metrics.expired.labels(priority="3")._value.get() == 1
    intake.close()


async def test_a_topics_default_priority_applies_to_jobs_without_one(ledger, engine) -> None:
    intake, _ = _intake(ledger, engine)
    intake.time_policy = TimePolicy(topic_priorities={"jobs": -4})
    await intake.accept({TP0: [_rec(0, 0, "default"), _rec(0, 1, "own", priority=9)]})
    await until(lambda: len(_queued(intake)) == 2)
    priorities = {t.job_id: t.priority for t in intake.batcher._scheduler._queue}
    assert priorities == {"default": -4, "own": 9}
    intake.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True), st.text(max_size=3)
            ),
            st.one_of(st.none(), st.integers(-(2**31), 2**31), st.floats(allow_nan=True)),
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),  # the record's timestamp
        ),
        min_size=1,
        max_size=6,
    )
)
async def test_generated_deadlines_priorities_and_timestamps_never_crash_intake(records) -> None:
    """Whatever `timeout_ms`, `priority` and record timestamp arrive (out of range, mistyped, missing,
    far in the future or past), every record is answered or queued, and none raises."""
    from kafka_scorer.worker.ledger import Ledger
    from kafka_scorer.worker.metrics import WorkerMetrics
    from tests.worker.conftest import FakeConsumer
    from tests.worker.conftest import settings as worker_settings

    ledger = Ledger(worker_settings(), WorkerMetrics(), FakeConsumer([TP0]))
    engine = FakeEngine()
    intake, outbox = _intake(ledger, engine)
    intake.time_policy = TimePolicy(max_job_age_ms=1000, topic_priorities={"jobs": -1})
    polled = []
    for offset, (timeout_ms, priority, timestamp) in enumerate(records):
        fields = {"timeout_ms": timeout_ms, "priority": priority}
        record = _rec(0, offset, f"j{offset}", **{k: v for k, v in fields.items() if v is not None})
        record.timestamp = timestamp if timestamp is not None else -1
        polled.append(record)
    await intake.accept({TP0: polled})
    await until(lambda: len(outbox.delivery.answered) + len(_queued(intake)) == len(records))  # type: ignore[union-attr]
    for result in outbox.delivery.answered:  # type: ignore[union-attr]
        assert result.error is not None and result.error.code in {
            ErrorCode.INVALID_REQUEST,
            ErrorCode.DEADLINE_EXCEEDED,
        }, result
    intake.close()
