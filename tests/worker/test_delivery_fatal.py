"""What is fatal stops the worker without committing anything it did not answer; what is not fatal is
retried. The Kafka clients are fakes here (unit tests of the worker's rules); the real broker runs the
same faults in tests/integration/test_delivery_faults.py and test_device_fault.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    InvalidSessionTimeoutError,
    NodeNotReadyError,
    ProducerFenced,
)

from kafka_scorer.config import Settings
from kafka_scorer.worker.consumer import FatalConsumerError, JobConsumer
from kafka_scorer.worker.producer import FatalProducerError
from tests.worker.test_delivery_refusals import TP, Harness

OTHER = TopicPartition("requests", 1)


class _FencedProducer:
    """What `ResultProducer.send_transaction` raises once a newer instance took the transactional id."""

    max_request_size = 1 << 20
    transactional = True

    def fits(self, record) -> bool:
        return True

    async def ensure_topic(self, topic: str) -> None:
        return None

    async def send_transaction(self, records, offsets, group_id) -> None:
        raise FatalProducerError(str(ProducerFenced()))


async def test_a_fenced_transactional_producer_stops_delivery_and_commits_nothing() -> None:
    h = Harness({}, exactly_once=True)
    h.delivery.producer = _FencedProducer()  # type: ignore[assignment]
    with pytest.raises(FatalProducerError):
        await h.delivery.deliver([h.answer(0), h.answer(1)])
    assert h.tracker.watermark(TP).committed is None
    assert h.settled == {}, "nothing was answered: no ticket may settle as answered"


class _Consumer:
    """The slice of AIOKafkaConsumer that JobConsumer's guards read."""

    def __init__(self, poll_error: BaseException | None = None) -> None:
        self.poll_error = poll_error
        self.committed: list[dict[TopicPartition, int]] = []
        self.on_coordinator_lookup = lambda: None
        self._coordinator = SimpleNamespace(
            generation=3,
            member_id="member-a",
            _coordination_task=None,
            _commit_lock=asyncio.Lock(),
            ensure_coordinator_known=self._ensure_coordinator_known,
            _do_commit_offsets=self._do_commit_offsets,
        )
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment=object()))
        self.highwaters = {TP: 10, OTHER: 5}

    async def _ensure_coordinator_known(self) -> None:
        self.on_coordinator_lookup()

    async def _do_commit_offsets(self, assignment: object, offsets: dict) -> None:
        """The one OffsetCommit request (fenced_commit.py sends it, never aiokafka's retrying commit)."""
        self.committed.append({tp: meta.offset for tp, meta in offsets.items()})

    async def getmany(self, timeout_ms: int, max_records: int):
        if self.poll_error is not None:
            raise self.poll_error
        return {}

    def assignment(self) -> set[TopicPartition]:
        return {TP, OTHER}

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highwaters.get(tp)


def _job_consumer(fake: _Consumer) -> JobConsumer:
    async def nothing(partitions) -> None:
        return None

    consumer = JobConsumer(Settings(_env_file=None, model="unused"), nothing, nothing)  # type: ignore[call-arg]
    consumer._consumer = fake  # type: ignore[assignment]
    return consumer


@pytest.mark.parametrize(
    ("error", "setting"),
    [(GroupAuthorizationFailedError("g"), "group_id"), (InvalidSessionTimeoutError(), "session_timeout_ms")],
)
async def test_membership_that_cannot_be_regained_is_fatal_with_the_setting_named(error, setting) -> None:
    with pytest.raises(FatalConsumerError, match=setting):
        await _job_consumer(_Consumer(error)).fetch(10, 10)


async def test_a_passing_poll_failure_is_retried_not_fatal() -> None:
    assert await _job_consumer(_Consumer(NodeNotReadyError(1))).fetch(10, 10) == {}


async def test_a_dead_group_coordination_is_fatal() -> None:
    fake = _Consumer(NodeNotReadyError(1))
    fake._coordinator._coordination_task = SimpleNamespace(done=lambda: True)
    with pytest.raises(FatalConsumerError, match="coordination"):
        await _job_consumer(fake).fetch(10, 10)


async def test_no_commit_without_group_membership() -> None:
    fake = _Consumer()
    consumer = _job_consumer(fake)
    fake._coordinator.generation = -1  # the group was lost (broker restarted, session expired)
    assert await consumer.commit({TP: 3}) == {}
    assert fake.committed == []


async def test_no_commit_beyond_the_fetched_log_end() -> None:
    fake = _Consumer()
    consumer = _job_consumer(fake)
    done = await consumer.commit({TP: 10, OTHER: 9, TopicPartition("requests", 7): 1})
    assert done == {TP: 10}, "OTHER's log ends at 5; partition 7 is not assigned"
    assert fake.committed == [{TP: 10}]


async def test_a_commit_is_not_sent_under_a_membership_it_was_not_taken_in() -> None:
    """The group rebalanced (or a broker that lost its data was rejoined) while the commit waited for
    the coordinator: the offsets belong to the old membership, so nothing is sent (aiokafka would
    retry them under the new one)."""
    fake = _Consumer()
    consumer = _job_consumer(fake)

    def rejoined() -> None:
        fake._coordinator.member_id = "member-b"
        fake._subscription.subscription.assignment = object()

    fake.on_coordinator_lookup = rejoined
    with pytest.raises(CommitFailedError, match="membership"):
        await consumer.commit({TP: 3})
    assert fake.committed == []


async def test_exactly_once_sends_no_result_whose_offset_may_not_be_committed() -> None:
    """Membership lost (or a log reset): the consumer's guard lets no offset through, so the results
    must not go out either; a transaction may only carry results whose offsets it commits."""
    h = Harness({}, exactly_once=True, committable=lambda offsets: {})
    await h.delivery.deliver([h.answer(0), h.answer(1)])
    assert h.producer.sent == []
    assert h.settled == {0: None, 1: None}, "dropped for the partition's next reader, not answered"
    assert h.tracker.watermark(TP).committed is None
