"""The producer's bounds, with aiokafka's producer faked: a refusal or a missing topic ends in `Refused`
after bounded tries, an outage never does (it is waited out). The same faults run against the real
broker in tests/integration/test_delivery_faults.py."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from kafka_scorer.kafka.producer import Refused
from kafka_scorer.kafka.records import OutRecord


class _Cluster:
    def __init__(self) -> None:
        self.topics: set[str] = set()
        self.unauthorized_topics: set[str] = set()

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return {0} if topic in self.topics else None


class _Client:
    """aiokafka's client as `ResultProducer.ensure_topic` sees it: metadata that may lack the topic."""

    def __init__(self) -> None:
        self.cluster = _Cluster()
        self.broker_answers = True

    def add_topic(self, topic: str) -> None:
        pass

    async def force_metadata_update(self) -> bool:
        await asyncio.sleep(0.01)
        return self.broker_answers


class _AIOKafkaProducer:
    def __init__(self, refusal: BaseException | None = None) -> None:
        self.client = _Client()
        self.refusal = refusal
        self.attempts = 0

    async def send(self, topic, value=None, key=None, headers=None):
        self.attempts += 1
        if self.refusal is not None:
            raise self.refusal
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def _producer(fake: _AIOKafkaProducer, grace_s: float = 0.3):
    from kafka_scorer.config import Settings
    from kafka_scorer.kafka.producer import ResultProducer

    settings = Settings(_env_file=None, model="unused")  # type: ignore[call-arg]
    producer = ResultProducer(settings, missing_topic_grace_s=grace_s)
    producer._producer = fake  # type: ignore[assignment]
    return producer


async def test_a_topic_the_broker_lacks_is_refused_after_the_grace_not_retried_for_ever() -> None:
    from aiokafka.errors import UnknownTopicOrPartitionError

    assert UnknownTopicOrPartitionError.retriable, "aiokafka would retry a missing topic for ever"
    producer = _producer(_AIOKafkaProducer(), grace_s=0.3)
    with pytest.raises(Refused) as refused:
        await asyncio.wait_for(producer.send(OutRecord("missing", b"v", None, [])), 5)
    assert isinstance(refused.value.cause, UnknownTopicOrPartitionError)


async def test_while_the_broker_is_unreachable_a_missing_topic_is_waited_for_not_refused() -> None:
    fake = _AIOKafkaProducer()
    fake.client.broker_answers = False
    producer = _producer(fake, grace_s=0.2)
    send = asyncio.create_task(producer.send(OutRecord("later", b"v", None, [])))
    await asyncio.sleep(0.8)
    assert not send.done(), "an outage is not a refusal: the send must keep waiting"
    fake.client.broker_answers = True
    fake.client.cluster.topics.add("later")
    await asyncio.wait_for(send, 5)
    assert fake.attempts == 1


async def test_the_worker_s_own_reply_topic_missing_is_waited_for_not_refused(caplog) -> None:
    """A broker back on an empty disk answers without the reply topic until the operator recreates it
    (issue 45): the worker's results for it are held, the wait said once, then sent; a job's own
    reply_topic header naming a missing topic is still refused after the grace (the test above)."""
    fake = _AIOKafkaProducer()
    producer = _producer(fake, grace_s=0.2)
    reply = producer._settings.reply_topic
    with caplog.at_level("INFO", logger="kafka_scorer.kafka.producer"):
        sends = [asyncio.create_task(producer.send(OutRecord(reply, b"v", None, []))) for _ in range(2)]
        await asyncio.sleep(1.0)
        assert not any(send.done() for send in sends), "the reply topic is waited for, past the grace"
        fake.client.cluster.topics.add(reply)
        await asyncio.wait_for(asyncio.gather(*sends), 5)
    assert fake.attempts == 2
    waits = [r for r in caplog.records if "is missing from the cluster" in r.getMessage()]
    assert len(waits) == 1 and "setting: reply_topic" in waits[0].getMessage()  # once, not per result
    assert len([r for r in caplog.records if "go out now" in r.getMessage()]) == 1


async def test_an_illegal_topic_name_is_refused_at_once() -> None:
    from aiokafka.errors import InvalidTopicError

    fake = _AIOKafkaProducer()
    with pytest.raises(Refused) as refused:
        await asyncio.wait_for(_producer(fake).send(OutRecord("no spaces allowed", b"v", None, [])), 1)
    assert isinstance(refused.value.cause, InvalidTopicError) and fake.attempts == 0


async def test_a_refusing_broker_is_tried_a_bounded_number_of_times() -> None:
    fake = _AIOKafkaProducer(TopicAuthorizationFailedError("t"))
    fake.client.cluster.topics.add("t")
    with pytest.raises(Refused):
        await asyncio.wait_for(_producer(fake).send(OutRecord("t", b"v", None, [])), 5)
    assert fake.attempts == 3


class _HungOffsetCommit(_AIOKafkaProducer):
    """A transactional producer whose offset commit never ends (aiokafka retrying, for ever, a broker's
    UNKNOWN_TOPIC_OR_PARTITION for an input topic deleted under the worker) and whose abort may hang."""

    def __init__(self, abort_hangs: bool) -> None:
        super().__init__()
        self.abort_hangs = abort_hangs
        self.calls: list[str] = []

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send_offsets_to_transaction(self, offsets, group_id) -> None:
        self.calls.append("offsets")
        await asyncio.Event().wait()

    async def commit_transaction(self) -> None:
        self.calls.append("commit")

    async def abort_transaction(self) -> None:
        self.calls.append("abort")
        if self.abort_hangs:
            await asyncio.Event().wait()


@pytest.mark.parametrize("abort_hangs", [False, True], ids=["abort-answers", "abort-hangs"])
async def test_a_transaction_whose_offset_commit_never_ends_is_aborted_and_raised_not_waited_on(
    abort_hangs, monkeypatch
) -> None:
    """The caller (worker/delivery.py) rewinds to the committed offsets on any raise; a hang would stall
    every partition's answers behind one transaction. A hung abort restarts the producer instead."""
    from aiokafka import TopicPartition

    fake = _HungOffsetCommit(abort_hangs)
    producer = _producer(fake)
    producer.transaction_step_s = 0.2
    restarted: list[str] = []

    async def stop() -> None:
        restarted.append("stop")

    async def start() -> None:
        restarted.append("start")

    monkeypatch.setattr(producer, "stop", stop)
    monkeypatch.setattr(producer, "start", start)
    record = OutRecord("replies", b"v", None, [])
    with pytest.raises(asyncio.TimeoutError):  # TimeoutError itself from 3.11
        await asyncio.wait_for(
            producer.send_transaction([record], {TopicPartition("requests", 0): 5}, "group"), 5
        )
    assert fake.calls == ["begin", "offsets", "abort"]
    assert restarted == (["stop", "start"] if abort_hangs else [])
