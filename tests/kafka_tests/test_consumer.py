"""The consumer's rules, with aiokafka's consumer faked: what is fatal (membership that cannot be
regained) stops the worker naming the setting, what passes is retried, and no commit goes out without
group membership or beyond the fetched log end. The real broker runs these faults in
tests/integration/test_log_reset.py and test_chaos.py."""

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
)

from kafka_scorer.kafka.consumer import FatalConsumerError, JobConsumer
from kafka_scorer.kafka.log_reset import FetchState
from kafka_scorer.kafka.subscription import log_of
from tests.kafka_tests.fake_partition import Connection
from tests.worker.conftest import TP, settings

OTHER = TopicPartition("requests", 1)


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
        assignment = SimpleNamespace(tps=[], active=True)  # no position known: nothing to hand back
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment=assignment))
        self.highwaters = {TP: 10, OTHER: 5}
        cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)
        self._client = SimpleNamespace(cluster=cluster, _conns={(1, 0): Connection()})

    def restart_broker(self) -> None:
        """The leader's process restarted on the same address: the fetch connection is a new one."""
        self._client._conns[(1, 0)] = Connection()

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
    """A consumer that has read both partitions from the leader's current connection."""
    consumer = JobConsumer(settings())
    consumer._consumer = fake  # type: ignore[assignment]
    consumer._resets.observe(
        {tp: FetchState(0, end, 1, log_of(fake, tp)) for tp, end in fake.highwaters.items()}
    )
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


async def test_no_commit_to_a_log_the_worker_has_not_read_from() -> None:
    """Issue 45: the broker restarted empty; offsets read from its previous life must not be committed to
    the new log (the restarted embedded broker accepted them, and the rejoined group read on from them,
    skipping every new record below). Neither before the worker has looked at the new connection..."""
    fake = _Consumer()
    consumer = _job_consumer(fake)
    fake.restart_broker()
    assert await consumer.commit({TP: 3}) == {}
    assert fake.committed == []


async def test_no_commit_when_the_broker_restarts_while_the_commit_waits_for_its_coordinator() -> None:
    """...nor when the restart happens while the commit waits for the coordinator (which waits out the
    whole outage): the log is asked again right before the request."""
    fake = _Consumer()
    consumer = _job_consumer(fake)
    fake.on_coordinator_lookup = fake.restart_broker
    with pytest.raises(CommitFailedError, match="log changed"):
        await consumer.commit({TP: 3})
    assert fake.committed == []
