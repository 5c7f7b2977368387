"""`ScoringClient` across broker trouble, on a real embedded broker of its own (the session broker is
shared and must not be stopped): a restart that loses every record (tansu keeps them in memory, as a
topic deleted and recreated does on real Kafka), and an outage with calls waiting.

Before the fix (issue 26) the reply reader kept asking the new log for its old positions and every
call after the restart timed out, while aiokafka printed hundreds of ERROR lines meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
import pytest
from aiokafka.errors import TopicAlreadyExistsError

from kafka_scorer.client import NotSent, ScoringClient, ScoringTimeout
from kafka_scorer.embedded.broker import EmbeddedBroker
from kafka_scorer.wire.protocol import Result, encode_result
from tests.integration.jobs import Sent, assert_matches_reference, mixed_jobs
from tests.integration.kafka_helpers import (
    BrokerInfo,
    InProcessWorker,
    Out,
    Topics,
    create_topics,
    fresh_topics,
    produce,
    read_topic,
)

pytestmark = pytest.mark.integration

KNOWN_OUTAGE_S = 2.0
"""How long an outage the client has announced goes on in the log test (aiokafka: ~100 lines a second)."""
_FIELDS = ("label_token_ids", "apply_softmax", "item_first", "multi_item", "return_pooled_hidden_states")


def _client(topics: Topics) -> ScoringClient:
    return ScoringClient(
        topics.broker.bootstrap, topics.requests, topics.replies, fetch_max_wait_ms=20, timeout=20.0
    )


def _jobs(scorer, seed: int, prefix: str, n: int = 4) -> list[Sent]:
    return [
        Sent(msgspec.structs.replace(s.job, id=None), "json", None, None)
        for s in mixed_jobs(n, seed=seed, model_name=scorer.describe().model_name, prefix=prefix)
    ]


async def _call(client: ScoringClient, sent: Sent):
    fields = {f: getattr(sent.job, f) for f in _FIELDS}
    return await client.score(sent.job.query, sent.job.items, **fields)


@contextlib.asynccontextmanager
async def _own_broker():
    broker = EmbeddedBroker().start()
    try:
        yield (
            broker,
            BrokerInfo(broker.bootstrap_servers, "tansu", transactions=False, min_session_timeout_ms=0),
        )
    finally:
        broker.stop(timeout_s=0.2)


async def _restart(broker: EmbeddedBroker, topics: Topics, caplog) -> None:
    """Stop the broker until the client says it is unreachable, start it empty on the same port and
    re-create the topics as `kafka-scorer broker` does (tansu: a topic a produce auto-creates first
    is not the one it makes)."""
    if broker.running:
        broker.stop(timeout_s=0.2)
    await _logged(caplog, "calls wait", timeout_s=20)
    broker.start()
    with contextlib.suppress(TopicAlreadyExistsError):
        await create_topics(topics.broker.bootstrap, [topics.requests, topics.replies], topics.partitions)


async def test_every_call_after_a_broker_restart_is_answered(
    causal_model, causal_scorer, causal_reference, caplog
) -> None:
    caplog.set_level(logging.INFO)
    before, after = _jobs(causal_scorer, 91, "before"), _jobs(causal_scorer, 92, "after", n=6)
    async with _own_broker() as (broker, info):
        topics = await fresh_topics(info, partitions=2)
        async with (
            InProcessWorker(topics.settings(causal_model), causal_scorer.engine),
            _client(topics) as client,
        ):
            answered_before = await asyncio.gather(*(_call(client, s) for s in before))
            await _restart(broker, topics, caplog)
            answered_after = [await _call(client, s) for s in after]  # one at a time, as a service does
            resets = client.resets
    for sent, result in zip(before + after, answered_before + answered_after, strict=True):
        assert_matches_reference(result, sent, causal_reference)
    assert resets >= 1  # the reply log was read again from its new beginning, not from memory
    said = [r.getMessage() for r in caplog.records if r.name.startswith("kafka_scorer")]
    assert sum("unreachable" in line and "calls wait" in line for line in said) == 1, said  # the client's
    assert any("reachable again" in line for line in said), said


async def test_an_outage_is_summarised_not_logged_line_by_line(caplog) -> None:
    """No worker: a call sent during the outage retries its send within its timeout and ends as
    `NotSent`; aiokafka's reconnect errors (about a hundred a second) are held back while the outage
    lasts, and the client says what happens in one line at each end. Sends work again after it."""
    caplog.set_level(logging.INFO)
    async with _own_broker() as (broker, info):
        topics = await fresh_topics(info, partitions=1)
        async with _client(topics) as client:
            caplog.clear()
            broker.stop(timeout_s=0.2)
            with pytest.raises(NotSent) as refused:
                await client.score([1, 2], [[3]], label_token_ids=[4], timeout=1.5)
            await _logged(caplog, "calls wait", timeout_s=20)
            await asyncio.sleep(KNOWN_OUTAGE_S)
            during = list(caplog.records)
            await _restart(broker, topics, caplog)
            back = await _logged(caplog, "reachable again", timeout_s=20)
            with pytest.raises(ScoringTimeout):  # acknowledged this time; no worker answers it
                await client.score([1, 2], [[3]], label_token_ids=[4], timeout=2.0)
    assert "not acknowledged by the broker within 1.5s" in refused.value.reason
    kafka = [r for r in during if r.name.startswith("aiokafka")]
    loud = [r.getMessage() for r in kafka if r.levelno >= logging.WARNING]
    assert len(loud) <= 1, loud  # the first connection error, as a WARNING; the rest held back
    ours = [
        r.getMessage() for r in during if r.name.startswith("kafka_scorer") and r.levelno >= logging.WARNING
    ]
    assert len(ours) == 1 and "unreachable" in ours[0], ours
    assert back.levelno == logging.INFO and "Kafka client lines held back" in back.getMessage()


async def _logged(caplog, words: str, timeout_s: float) -> logging.LogRecord:
    """The first record of ours holding `words`, once it is there."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = [r for r in caplog.records if r.name.startswith("kafka_scorer") and words in r.getMessage()]
        if found:
            return found[0]
        assert asyncio.get_running_loop().time() < deadline, f"no {words!r} logged"
        await asyncio.sleep(0.1)


def _reply(topic: str, job_id: str, correlation: str) -> Out:
    result = Result(id=job_id, scores=[[0.25]])
    headers = [("correlation_id", correlation.encode()), ("content-type", b"application/json")]
    return Out(topic, encode_result(result), headers=headers)


async def test_a_new_log_that_grew_past_the_old_position_is_read_from_its_start(caplog) -> None:
    """The case a log end cannot show: after the restart the call's reply lands at offset 0 of the new
    reply log and other replies fill it past the reader's old position before the reader fetches
    again. The test plays the worker. Read from the old position on, the reply would be skipped."""
    caplog.set_level(logging.INFO)
    async with _own_broker() as (broker, info):
        topics = await fresh_topics(info, partitions=1)
        filler = [_reply(topics.replies, f"other-{i}", f"other-{i}") for i in range(3)]
        async with _client(topics) as client:
            await produce(info.bootstrap, filler)  # the reader reads them: its position is 3
            await asyncio.sleep(1.0)
            await _restart(broker, topics, caplog)
            call = asyncio.create_task(
                client.score([1, 2], [[3]], label_token_ids=[4], id="late", timeout=20)
            )
            requests = await read_topic(
                info.bootstrap, topics.requests, lambda rs: len(rs) >= 1, timeout_s=10
            )
            correlation = dict(requests[0].headers)["correlation_id"].decode()
            answer = _reply(topics.replies, "late", correlation)
            more = [_reply(topics.replies, f"new-{i}", f"new-{i}") for i in range(5)]
            await produce(info.bootstrap, [answer, *more])  # offsets 0-5 of the new log: past 3
            result = await call
            resets = client.resets
    assert result.id == "late" and result.scores == [[0.25]]
    assert resets >= 1
