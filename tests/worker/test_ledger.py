"""The in-flight ledger: counts, watermarks and backpressure in one place, with the consumer faked."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import TopicPartition

from kafka_scorer.wire.protocol import ErrorCode, Result, error_result
from kafka_scorer.worker.ledger import Ledger
from kafka_scorer.worker.metrics import WorkerMetrics
from tests.worker.conftest import TP, FakeConsumer, open_ticket, settings


def _ledger(consumer: FakeConsumer, **values: object) -> Ledger:
    ledger = Ledger(settings(**values), WorkerMetrics(), consumer)
    ledger.tracker.assign([TP])
    return ledger


def test_a_ticket_counts_from_open_to_settle_and_holds_back_its_partitions_commit(ledger) -> None:
    first, second = open_ticket(ledger, 5), open_ticket(ledger, 6)
    ledger.queued(first, 40)
    assert (ledger.jobs, ledger.tokens) == (2, 40)
    second.watermark.answered(6)
    second.settle(Result(id="j6", scores=[[1.0]]))
    assert ledger.tracker.watermark(TP).commit_offset() == 5, "record 5 is still unanswered"
    first.watermark.answered(5)
    first.settle(Result(id="j5", scores=[[1.0]]))
    assert (ledger.jobs, ledger.tokens, ledger.peak_jobs, ledger.peak_tokens) == (0, 0, 2, 40)
    assert ledger.tracker.watermark(TP).commit_offset() == 7
    assert ledger.metrics.jobs._value.get() == 2 and ledger.metrics.items._value.get() == 2


def test_backpressure_pauses_above_the_budget_and_resumes_below_half_of_it() -> None:
    consumer = FakeConsumer()
    ledger = _ledger(consumer, max_inflight_tokens=100)
    ledger.started = True
    tickets = [open_ticket(ledger, i) for i in range(3)]
    for ticket in tickets[:2]:
        ledger.queued(ticket, 50)
    assert consumer.paused() == set(), "at the budget, not above it"
    ledger.queued(tickets[2], 50)
    assert consumer.paused() == {TP} and ledger.paused
    tickets[0].settle(None)  # 100 left: not yet below half
    assert consumer.paused() == {TP}
    tickets[1].settle(None)  # 50 left: half the budget
    assert consumer.paused() == set() and ledger.resumes == 1
    assert ledger.metrics.pauses._value.get() == 1


def test_the_in_flight_gauges_read_the_ledger_when_scraped() -> None:
    consumer = FakeConsumer()
    ledger = _ledger(consumer, max_inflight_tokens=100)
    gauge = ledger.metrics.registry.get_sample_value
    names = ("kafka_scorer_inflight_tokens", "kafka_scorer_inflight_jobs", "kafka_scorer_paused_partitions")
    tickets = [open_ticket(ledger, i) for i in range(3)]
    ledger.queued(tickets[0], 70)
    assert [gauge(name) for name in names] == [70, 3, 0], "not started: no partition counts as paused"
    ledger.started = True
    ledger.queued(tickets[1], 70)
    assert [gauge(name) for name in names] == [140, 3, 1]
    for ticket in tickets:
        ticket.settle(None)
    assert [gauge(name) for name in names] == [0, 0, 0]


def test_a_draining_worker_is_never_resumed_by_backpressure() -> None:
    consumer = FakeConsumer()
    ledger = _ledger(consumer, max_inflight_tokens=10)
    ticket = open_ticket(ledger, 0)
    ledger.queued(ticket, 11)
    ledger.draining = True
    ticket.settle(None)
    assert consumer.paused() == {TP}, "draining: the partitions stay paused"


def test_an_offset_handed_out_again_keeps_the_earlier_jobs(caplog) -> None:
    """Issue 45: a broker that handed out offset 3 after offset 10 (tansu gave two records one offset
    after a restart) is not a seek the worker made: the earlier jobs are not read again, so dropping
    them skipped them. Both stay answered-to-be; the commit waits for the lowest. (The worker's own
    repositionings restart the watermark explicitly: worker/rebalance.py.)"""
    ledger = _ledger(FakeConsumer())
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.worker.ledger"):
        old = open_ticket(ledger, 10)
        new = open_ticket(ledger, 3)
        open_ticket(ledger, 4)
    assert old.watermark is new.watermark and not old.watermark.closed
    assert ledger.tracker.watermark(TP).commit_offset() == 3
    assert sum("handed out again" in r.getMessage() for r in caplog.records) == 1


def test_an_error_result_is_counted_by_code_and_logged_once(ledger, caplog) -> None:
    ticket = open_ticket(ledger, 0)
    with caplog.at_level(logging.INFO, logger="kafka_scorer.worker.ledger"):
        ticket.settle(error_result("j0", ErrorCode.INTERNAL, "boom\nsecond line"))
    assert ledger.metrics.errors.labels(code="internal")._value.get() == 1
    (line,) = [r for r in caplog.records if "error result" in r.getMessage()]
    assert line.levelno == logging.WARNING and "\n" not in line.getMessage()


async def test_settled_waits_for_the_partitions_work_or_the_deadline(ledger) -> None:
    ticket = open_ticket(ledger, 0)

    async def answer_later() -> None:
        await asyncio.sleep(0.05)
        ticket.watermark.answered(0)
        ticket.settle(Result(id="j0", scores=[]))

    task = asyncio.create_task(answer_later())
    await ledger.settled([TP], time.monotonic() + 5)
    assert ledger.tracker.unanswered([TP]) == 0
    await task
    open_ticket(ledger, 1)
    started = time.monotonic()
    await ledger.settled([TP], started + 0.05)
    assert ledger.tracker.unanswered([TP]) == 1, "the deadline ends the wait; the work stays in flight"


def test_a_bulk_backlog_pauses_only_the_bulk_topic_and_interactive_work_pauses_its_own() -> None:
    """The lower lane pauses on all the work in flight; the top lane only on its own (or on twice the
    budget in all): a bulk backlog never stops interactive records from being read."""
    bulk, live = TopicPartition("bulk", 0), TopicPartition("live", 0)
    consumer = FakeConsumer([bulk, live])
    values = {"max_inflight_tokens": 100, "topic_priorities": "bulk=-1"}
    ledger = Ledger(settings(**values), WorkerMetrics(), consumer)
    ledger.tracker.assign([bulk, live])
    backlog = [open_ticket(ledger, i, tp=bulk) for i in range(2)]
    for ticket in backlog:
        ticket.priority = -1
        ledger.queued(ticket, 60)  # 120 in flight, all bulk
    assert consumer.paused() == {bulk}, "the bulk topic only; interactive jobs still come in"
    assert ledger.held({TopicPartition("bulk", 1), TopicPartition("live", 1)}) == {TopicPartition("bulk", 1)}
    interactive = [open_ticket(ledger, i, tp=live) for i in range(2)]
    ledger.queued(interactive[0], 60)
    assert consumer.paused() == {bulk}, "60 interactive tokens: under the budget on their own"
    ledger.queued(interactive[1], 60)
    assert consumer.paused() == {bulk, live}, "120 interactive tokens: the top lane is over too"
    for ticket in interactive:
        ticket.settle(None)
    assert consumer.paused() == {bulk, live}, "all work (120) is still over the budget"
    backlog[0].settle(None)
    assert consumer.paused() == {bulk}, "60 in flight: the top lane resumes, the bulk lane waits for half"
    backlog[1].settle(None)
    assert consumer.paused() == set() and ledger.metrics.pauses._value.get() == 1


def test_on_one_shared_topic_jobs_below_its_priority_may_fill_a_second_budget() -> None:
    """Issue 26: bulk jobs sent at priority -1 on the interactive jobs' topic. They count against the
    twice-the-budget ceiling only, so the worker reads on past one budget of bulk and the interactive
    jobs behind it get in; the interactive jobs are still held to the budget on their own."""
    consumer = FakeConsumer()
    ledger = _ledger(consumer, max_inflight_tokens=100)
    ledger.started = True
    bulk = [open_ticket(ledger, i) for i in range(4)]
    for ticket in bulk[:3]:
        ticket.priority = -1
        ledger.queued(ticket, 60)
    assert consumer.paused() == set(), "180 bulk tokens: within twice the budget"
    live = open_ticket(ledger, 10)
    ledger.queued(live, 30)
    assert consumer.paused() == {TP}, "180 + 30 in all: over twice the budget"
    live.settle(None)
    bulk[0].settle(None)
    assert consumer.paused() == {TP}, "120 in flight: over the budget, no resume yet"
    bulk[1].settle(None)
    assert consumer.paused() == set(), "60 in flight: resumed"
    others = [open_ticket(ledger, 20 + i) for i in range(2)]
    for ticket in others:
        ledger.queued(ticket, 55)
    assert consumer.paused() == {TP}, "110 tokens at the topic's priority: over the budget on their own"
