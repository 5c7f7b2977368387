"""Answer, then commit (SPEC §7): one contract both delivery modes keep, then what each mode adds.

`DeliveryContract` is written once and run for at-least-once and for exactly-once (transactions), with
the broker faked (a unit test of the delivery rules); tests/integration/test_delivery.py and
test_chaos.py (exactly-once under repeated SIGKILLs) run both modes against the real broker.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import MessageSizeTooLargeError, ProducerFenced, TopicAuthorizationFailedError

from kafka_scorer.kafka.producer import FatalProducerError
from kafka_scorer.wire.protocol import ErrorCode, Result, decode_result, error_result
from kafka_scorer.wire.provenance import ServedModel
from kafka_scorer.worker.delivery import AtLeastOnceDelivery, DeliveryParts, Undeliverable
from kafka_scorer.worker.envelope import RecordCodec
from kafka_scorer.worker.exactly_once import ExactlyOnceDelivery
from kafka_scorer.worker.ledger import Ledger
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.ticket import Ticket
from tests.worker.conftest import (
    DEFAULT_REPLY_TOPIC,
    TP,
    FakeConsumer,
    FakeProducer,
    answered,
    open_ticket,
    settings,
)

DEFAULT = DEFAULT_REPLY_TOPIC
SERVED = ServedModel("m", revision="rev-1", dtype="float32")
CODEC = RecordCodec(DEFAULT, lambda topic: f"{topic}.DLT", 1 << 20, "m")


class RecordingLedger(Ledger):
    """The real ledger, remembering how each ticket settled (offset -> result, None when dropped)."""

    def __init__(self, consumer: FakeConsumer) -> None:
        super().__init__(settings(), WorkerMetrics(), consumer)
        self.outcomes: dict[int, Result | None] = {}

    def settle(self, ticket: Ticket[Any], result: Result | None) -> None:
        assert ticket.offset not in self.outcomes, "a ticket settles exactly once"
        self.outcomes[ticket.offset] = result
        super().settle(ticket, result)


class Harness:
    def __init__(
        self,
        refused: dict[str, BaseException] | None = None,
        exactly_once: bool = False,
        producer: Any = None,
    ) -> None:
        self.producer = producer or FakeProducer(refused, transactional=exactly_once)
        self.consumer = FakeConsumer()
        self.ledger = RecordingLedger(self.consumer)
        self.tracker = self.ledger.tracker
        self.tracker.assign([TP])
        self.rewinds = 0
        parts = DeliveryParts(self.producer, self.tracker, WorkerMetrics(), SERVED, self.consumer, CODEC)
        if exactly_once:
            self.delivery: Any = ExactlyOnceDelivery(parts, self, group_id="g")
        else:
            self.delivery = AtLeastOnceDelivery(parts)

    async def rewind(self) -> None:
        self.rewinds += 1

    @property
    def settled(self) -> dict[int, Result | None]:
        return self.ledger.outcomes

    def open(self, offset: int, reply_topic: str = DEFAULT) -> Ticket[Any]:
        return open_ticket(self.ledger, offset, reply_topic=reply_topic)

    def answer(self, offset: int, reply_topic: str = DEFAULT, dead_letter: str | None = None) -> Ticket[Any]:
        return answered(self.open(offset, reply_topic), dead_letter)

    def results_on(self, topic: str) -> list[Result]:
        return [
            decode_result(r.value, "application/json")
            for r in self.producer.sent
            if r.topic == topic and r.result
        ]

    async def committed(self) -> int | None:
        await self.delivery.commit()
        return self.tracker.watermark(TP).committed


class DeliveryContract:
    """What every delivery mode promises; subclasses say which mode."""

    exactly_once = False

    async def harness(self, refused: dict[str, BaseException] | None = None) -> Harness:
        """The delivery under test; a subclass on a real broker builds it there
        (tests/integration/test_delivery_contract.py)."""
        return Harness(refused, exactly_once=self.exactly_once)

    async def results_on(self, h: Harness, topic: str, count: int) -> list[Result]:
        """The results produced to `topic`, once `count` of them are there (or none are coming)."""
        return h.results_on(topic)

    async def topics_written(self, h: Harness) -> list[str]:
        return [r.topic for r in h.producer.sent]

    async def test_answered_records_are_produced_and_committed(self) -> None:
        h = await self.harness()
        await h.delivery.deliver([h.answer(0), h.answer(1)])
        assert [r.id for r in await self.results_on(h, DEFAULT, 2)] == ["j0", "j1"]
        assert await h.committed() == 2
        assert all(h.settled[i] is not None for i in (0, 1))

    async def test_no_commit_passes_an_unanswered_record(self) -> None:
        h = await self.harness()
        first = h.open(0)
        await h.delivery.deliver([h.answer(1)])  # finished before the older record 0
        assert (await h.committed() or 0) == 0, "a commit may reach record 0 but never pass it"
        await h.delivery.deliver([answered(first)])
        assert await h.committed() == 2
        assert {r.id for r in await self.results_on(h, DEFAULT, 2)} == {"j0", "j1"}

    async def test_a_ticket_of_a_revoked_partition_is_dropped_not_produced(self) -> None:
        h = await self.harness()
        ticket = h.answer(0)
        h.tracker.revoke([TP])
        await h.delivery.deliver([ticket])
        assert h.settled == {0: None}
        assert await self.results_on(h, DEFAULT, 0) == []

    async def test_a_dead_letter_copy_goes_out_with_the_answer(self) -> None:
        h = await self.harness()
        await h.delivery.deliver([h.answer(0, dead_letter="requests.DLT")])
        topics = await self.topics_written(h)
        assert topics == ["requests.DLT", DEFAULT], "the copy first, then the answer that names it"
        assert await h.committed() == 1

    async def test_every_result_carries_the_served_models_provenance(self) -> None:
        h = await self.harness()
        ticket = h.open(0).answer(error_result("j0", ErrorCode.INVALID_MESSAGE, "not JSON"))
        await h.delivery.deliver([ticket])
        (result,) = await self.results_on(h, DEFAULT, 1)
        assert (result.model, result.model_revision, result.dtype) == ("m", "rev-1", "float32")

    async def test_a_refused_reply_topic_is_answered_on_the_default_topic(self) -> None:
        h = await self.harness({"denied": TopicAuthorizationFailedError("denied")})
        await h.delivery.deliver([h.answer(0, reply_topic="denied")])
        (result,) = await self.results_on(h, DEFAULT, 1)
        assert result.error is not None and result.error.code is ErrorCode.INVALID_REQUEST
        assert "denied" in result.error.message
        assert await h.committed() == 1

    async def test_an_answer_no_topic_takes_stops_delivery_uncommitted(self) -> None:
        h = await self.harness({DEFAULT: TopicAuthorizationFailedError(DEFAULT)})
        with pytest.raises(Undeliverable, match="reply_topic"):
            await h.delivery.deliver([h.answer(0)])
        assert (await h.committed() or 0) == 0
        assert await self.results_on(h, DEFAULT, 0) == [] and h.settled == {}


class TestAtLeastOnce(DeliveryContract):
    exactly_once = False


class TestExactlyOnce(DeliveryContract):
    exactly_once = True

    async def test_a_fenced_transactional_producer_stops_delivery_and_commits_nothing(self) -> None:
        h = await self.harness()

        async def fenced(records, offsets, group_id, still_ours=None) -> None:
            raise FatalProducerError(str(ProducerFenced()))

        h.producer.send_transaction = fenced  # type: ignore[method-assign]
        with pytest.raises(FatalProducerError):
            await h.delivery.deliver([h.answer(0), h.answer(1)])
        assert h.tracker.watermark(TP).committed is None
        assert h.settled == {}, "nothing was answered: no ticket may settle as answered"

    async def test_no_result_goes_out_whose_offset_may_not_be_committed(self) -> None:
        """Membership lost (or a log reset): the consumer's guard lets no offset through, so the results
        must not go out either; a transaction may only carry results whose offsets it commits."""
        h = await self.harness()
        h.consumer.membership_lost = True
        await h.delivery.deliver([h.answer(0), h.answer(1)])
        assert h.producer.sent == []
        assert h.settled == {0: None, 1: None}, "dropped for the partition's next reader, not answered"
        assert h.tracker.watermark(TP).committed is None


# ---- at-least-once: the fallbacks keep answering what they can, in order -----------------------------


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
async def test_an_answer_no_topic_takes_is_never_committed_and_never_passed(
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
    assert h.consumer.commits == [{TP: 1}], "the commit may reach the stuck record but never pass it"


# ---- exactly-once: a transaction of a lost membership never commits (worker/transaction_fence.py) ------


def _during_transaction(h: Harness, change) -> None:
    """Run `change` while the transaction's records are being sent (after its claim was taken)."""
    send = h.producer.send

    async def changing_send(record):
        change()
        await send(record)

    h.producer.send = changing_send  # type: ignore[method-assign]


@pytest.mark.parametrize("lost", ["membership", "rejoined", "partition"])
async def test_a_transaction_whose_claim_is_gone_aborts_before_its_commit(lost) -> None:
    """The group membership lost, replaced by another generation, or the partition closed (revoked, reset)
    while the transaction waited: it aborts, its offsets stay uncommitted, its tickets are dropped."""
    h = Harness(exactly_once=True)
    tickets = [h.answer(0), h.answer(1)]
    changes = {
        "membership": lambda: setattr(h.consumer, "membership_lost", True),
        "rejoined": lambda: setattr(h.consumer, "generation", h.consumer.generation + 1),
        "partition": lambda: h.tracker.revoke([TP]),
    }
    _during_transaction(h, changes[lost])
    await h.delivery.deliver(tickets)
    assert h.producer.aborted == 1
    assert h.producer.transactions == []
    assert h.settled == {0: None, 1: None}, "left to the partition's next reader"
    assert h.rewinds == 1, "rewound: the watermarks of its other partitions counted these answers as given"
    assert h.delivery.floors([TP]) == {}


async def test_what_a_transaction_committed_is_the_floor_of_a_later_read() -> None:
    h = Harness(exactly_once=True)
    await h.delivery.deliver([h.answer(0), h.answer(1)])
    assert h.producer.transactions == [{TP: 2}]
    assert h.delivery.floors([TP]) == {TP: 2}
    await h.delivery.settle_in_flight()  # nothing in flight: returns at once
