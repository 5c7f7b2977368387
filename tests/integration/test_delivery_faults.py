"""Never skip, on the real broker: a reply topic the broker refuses gets the answer on the default reply
topic instead; an answer no topic takes stops the worker non-zero with its offset uncommitted.

The refusal is the broker's TOPIC_AUTHORIZATION_FAILED, raised at the client boundary (aiokafka's
`send`) for the denied topics: tansu has no ACLs to configure. Everything else is real. Before the fix,
the worker logged "record skipped" and committed the offset of a record it never answered.
"""

from __future__ import annotations

import asyncio

import aiokafka
import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from kafka_scorer.wire.protocol import ErrorCode, Job
from tests.integration.brokers import on_each_broker
from tests.integration.jobs import Sent, to_record
from tests.integration.kafka_helpers import InProcessWorker, Out, committed_offsets, fresh_topics, produce

pytestmark = pytest.mark.integration


def _job(job_id: str) -> Sent:
    return Sent(
        Job(id=job_id, query=[3, 4, 5], items=[[7], [8, 9]], label_token_ids=[5, 6]), "json", None, None
    )


@on_each_broker()
async def test_refused_reply_topic_falls_back_and_an_undeliverable_answer_stops_uncommitted(
    kafka, causal_model, causal_scorer, monkeypatch, caplog
) -> None:
    topics = await fresh_topics(kafka, partitions=1)
    denied = {f"{topics.requests}.denied", topics.dead_letters}
    send = aiokafka.AIOKafkaProducer.send

    async def refusing_send(self, topic, *args, **kwargs):
        if topic in denied:
            raise TopicAuthorizationFailedError(topic)
        return await send(self, topic, *args, **kwargs)

    monkeypatch.setattr(aiokafka.AIOKafkaProducer, "send", refusing_send)
    redirected = to_record(_job("redirected"), topics.requests, 0, True)
    redirected.headers.append(("reply_topic", f"{topics.requests}.denied".encode()))
    undecodable = Out(topics.requests, b"\xc1 neither JSON nor MessagePack", partition=0)

    async with InProcessWorker(topics.settings(causal_model), causal_scorer.engine) as worker:
        await produce(kafka.bootstrap, [to_record(_job("plain"), topics.requests, 0, True), redirected])
        replies = {r.id: r for r in await topics.read_answers(2, timeout_s=60)}
        committed, _ = await topics.wait_for_commits(2)
        assert committed == {0: 2}

        # Its dead-letter copy is refused: the answer can go nowhere the contract allows.
        await produce(kafka.bootstrap, [undecodable, to_record(_job("after"), topics.requests, 0, True)])
        for _ in range(300):
            if not worker.running:
                break
            await asyncio.sleep(0.1)
        assert not worker.running, "an undeliverable answer must stop the worker"
        rc = await worker.stop()

    assert replies["plain"].error is None
    fallback = replies["redirected"].error
    assert (
        fallback is not None and fallback.code is ErrorCode.INVALID_REQUEST and ".denied" in fallback.message
    )
    assert rc == 1
    final = await committed_offsets(kafka.bootstrap, topics.group, topics.requests, 1)
    assert final == {0: 2}, "the undeliverable record (offset 2) must stay uncommitted"
    stops = [r.getMessage() for r in caplog.records if "dead_letter_topic" in r.getMessage()]
    assert stops, "the operator must see a line naming the setting"
