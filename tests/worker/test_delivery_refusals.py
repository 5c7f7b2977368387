"""Never skip: an answer the broker refuses goes elsewhere or stops the worker, and its offset is never
committed (SPEC §7). The broker is a fake here (a unit test of the delivery rules); the same fault runs
against the real broker in tests/integration/test_delivery_faults.py."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, TopicAuthorizationFailedError

from kafka_scorer.wire.protocol import ErrorCode, Result, decode_result
from kafka_scorer.worker.delivery import (
    Answer,
    AtLeastOnceDelivery,
    ExactlyOnceDelivery,
    Ticket,
    Undeliverable,
)
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.offsets import OffsetTracker
from kafka_scorer.worker.producer import Refused
from kafka_scorer.worker.wire import Origin, OutRecord

TP = TopicPartition("requests", 0)
DEFAULT = "replies"


class FakeProducer:
    """Acknowledges every record except those to `refused` topics, which it refuses like the real
    `ResultProducer` does after its bounded tries."""

    max_request_size = 1 << 20
    transactional = False

    def __init__(self, refused: dict[str, BaseException]) -> None:
        self.refused = refused
        self.sent: list[OutRecord] = []

    def fits(self, record: OutRecord) -> bool:
        return True

    async def ensure_topic(self, topic: str) -> None:
        if topic in self.refused:
            raise Refused(topic, self.refused[topic])

    async def send(self, record: OutRecord) -> None:
        await asyncio.sleep(0)
        await self.ensure_topic(record.topic)
        self.sent.append(record)

    async def send_transaction(self, records, offsets, group_id) -> None:
        for record in records:
            await self.send(record)


class Harness:
    def __init__(
        self, refused: dict[str, BaseException], exactly_once: bool = False, committable=dict
    ) -> None:
        self.producer = FakeProducer(refused)
        self.tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self.tracker.assign([TP])
        self.settled: dict[int, Result | None] = {}
        self.commits: list[dict[TopicPartition, int]] = []

        def on_settled(ticket: Ticket, result: Result | None) -> None:
            self.settled[ticket.offset] = result

        async def commit(offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
            self.commits.append(dict(offsets))
            return offsets

        async def rewind() -> None:
            return None

        common = {"default_reply_topic": DEFAULT, "model_name": "m"}
        if exactly_once:
            self.delivery = ExactlyOnceDelivery(
                self.producer,
                self.tracker,
                on_settled,
                WorkerMetrics(),
                rewind,
                group_id="g",
                committable=committable,
                **common,
            )  # type: ignore[arg-type]
        else:
            self.delivery = AtLeastOnceDelivery(
                self.producer, self.tracker, on_settled, WorkerMetrics(), commit, **common
            )  # type: ignore[arg-type]

    def answer(self, offset: int, reply_topic: str = DEFAULT, dead_letter: str | None = None) -> Answer:
        mark = self.tracker.watermark(TP)
        mark.received(offset)
        origin = Origin(TP.topic, TP.partition, offset, None, reply_topic, "json", None)
        ticket = Ticket(tp=TP, origin=origin, job_id=f"j{offset}", watermark=mark, received_at=0.0)
        result = Result(id=f"j{offset}", scores=[[0.5]], model="m")
        dead = OutRecord(dead_letter, b"x", None, []) if dead_letter else None
        return Answer(ticket, result, dead)

    def results_on(self, topic: str) -> list[Result]:
        return [decode_result(r.value, "application/json") for r in self.producer.sent if r.topic == topic]


async def test_a_refused_reply_topic_is_answered_on_the_default_topic_and_committed() -> None:
    h = Harness({"denied": TopicAuthorizationFailedError("denied")})
    await h.delivery.deliver([h.answer(0, reply_topic="denied"), h.answer(1)])
    await h.delivery.commit()
    fallback = {r.id: r for r in h.results_on(DEFAULT)}
    assert set(fallback) == {"j0", "j1"}
    assert fallback["j0"].error is not None and fallback["j0"].error.code is ErrorCode.INVALID_REQUEST
    assert "denied" in fallback["j0"].error.message
    assert fallback["j1"].scores == [[0.5]]
    assert h.commits == [{TP: 2}]


async def test_a_result_over_the_topics_size_limit_becomes_too_long_on_the_default_topic() -> None:
    h = Harness({"small": MessageSizeTooLargeError()})
    await h.delivery.deliver([h.answer(0, reply_topic="small")])
    (result,) = h.results_on(DEFAULT)
    assert result.error is not None and result.error.code is ErrorCode.TOO_LONG


@pytest.mark.parametrize(
    ("refused", "reply_topic", "dead_letter", "setting"),
    [
        ({"denied", DEFAULT}, "denied", None, "reply_topic"),  # fallback refused too
        ({DEFAULT}, DEFAULT, None, "reply_topic"),  # the default itself refused: nowhere to go
        ({"requests.DLT"}, DEFAULT, "requests.DLT", "dead_letter_topic"),  # the dead-letter copy
    ],
)
async def test_an_answer_no_topic_takes_stops_delivery_and_is_never_committed(
    refused: set[str], reply_topic: str, dead_letter: str | None, setting: str
) -> None:
    h = Harness({t: TopicAuthorizationFailedError(t) for t in refused})
    before, stuck, after = h.answer(0, "open"), h.answer(1, reply_topic, dead_letter), h.answer(2, "open")
    await h.delivery.deliver([before])
    with pytest.raises(Undeliverable, match=setting):
        await h.delivery.deliver([stuck])
    await h.delivery.deliver([after])
    assert h.settled[0] is not None and h.settled[2] is not None
    await h.delivery.commit()
    assert 1 not in h.settled, "the stuck record must stay unanswered, neither answered nor dropped"
    assert h.commits == [{TP: 1}], "the commit may reach the stuck record but never pass it"


async def test_exactly_once_answers_a_refused_reply_topic_on_the_default_topic() -> None:
    h = Harness({"denied": TopicAuthorizationFailedError("denied")}, exactly_once=True)
    await h.delivery.deliver([h.answer(0, reply_topic="denied")])
    (result,) = h.results_on(DEFAULT)
    assert result.error is not None and result.error.code is ErrorCode.INVALID_REQUEST
    assert h.tracker.watermark(TP).committed == 1


async def test_exactly_once_stops_when_no_topic_takes_the_answer() -> None:
    h = Harness({DEFAULT: TopicAuthorizationFailedError(DEFAULT)}, exactly_once=True)
    with pytest.raises(Undeliverable, match="reply_topic"):
        await h.delivery.deliver([h.answer(0)])
    assert h.tracker.watermark(TP).committed is None
    assert h.producer.sent == []


# ---- the producer's bounds: a refusal or a missing topic ends in `Refused`, an outage never does ----


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
    from kafka_scorer.worker.producer import ResultProducer

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
