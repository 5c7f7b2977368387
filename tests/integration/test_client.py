"""`ScoringClient` against a real broker and a running worker: many calls in flight on one client,
each answered with its own job's result (scores from the independent reference), typed failures, and
a timeout that both raises and travels with the job as `timeout_ms`. On the session broker and on Apache
Kafka."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from kafka_scorer.client import (
    ClientClosed,
    JobFailed,
    NotSent,
    NotStarted,
    ScoringClient,
    ScoringTimeout,
    TopicMissing,
)
from kafka_scorer.embedded.broker import EmbeddedBroker, free_port
from kafka_scorer.wire.protocol import ErrorCode, Job, decode_job
from tests.integration.brokers import on_each_broker
from tests.integration.jobs import MODEL_VOCAB, Sent, assert_matches_reference, mixed_jobs
from tests.integration.kafka_helpers import InProcessWorker, fresh_topics, read_topic
from tests.integration.raw_records import produce_with_raw_header

pytestmark = pytest.mark.integration

CONCURRENT = 60
_FIELDS = ("label_token_ids", "apply_softmax", "item_first", "multi_item", "return_pooled_hidden_states")


def _client(kafka, topics, **kwargs) -> ScoringClient:
    return ScoringClient(
        kafka.bootstrap,
        topics.requests,
        topics.replies,
        fetch_max_wait_ms=20,
        client_id="test-client",
        **kwargs,
    )


@on_each_broker()
async def test_many_concurrent_calls_each_get_their_own_jobs_result(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    topics = await fresh_topics(kafka, partitions=3)
    sent = [
        Sent(msgspec.structs.replace(s.job, id=None), "json", None, None)  # ids from the client
        for s in mixed_jobs(
            CONCURRENT, seed=71, model_name=causal_scorer.describe().model_name, prefix="client"
        )
    ]
    async with (
        InProcessWorker(topics.settings(causal_model), causal_scorer.engine),
        _client(kafka, topics) as client,
    ):
        fields = [{f: getattr(s.job, f) for f in _FIELDS} for s in sent]
        results = await asyncio.gather(
            *(client.score(s.job.query, s.job.items, **f) for s, f in zip(sent, fields, strict=True))
        )
    assert len({r.id for r in results}) == CONCURRENT  # a fresh correlation id per call, used as its id
    for s, result in zip(sent, results, strict=True):
        assert_matches_reference(result, s, causal_reference)  # each call got its own job's scores


@on_each_broker()
async def test_an_error_result_raises_job_failed_and_request_returns_it(
    kafka, causal_model, causal_scorer
) -> None:
    topics = await fresh_topics(kafka, partitions=1)
    bad = Job(id="bad-labels", query=[1, 2], items=[[3]], label_token_ids=[MODEL_VOCAB + 5])
    async with (
        InProcessWorker(topics.settings(causal_model), causal_scorer.engine),
        _client(kafka, topics) as client,
    ):
        with pytest.raises(JobFailed) as failed:
            await client.score_job(bad)
        returned = await client.request(bad)
    assert failed.value.code is ErrorCode.INVALID_REQUEST and failed.value.result.id == "bad-labels"
    assert returned.error is not None and returned.error.code is ErrorCode.INVALID_REQUEST


@on_each_broker()
async def test_a_timeout_raises_and_the_job_carries_the_same_deadline(kafka) -> None:
    """No worker reads the topic: the call gives up after its timeout, and the record it produced says
    so to any worker that reads it later (timestamp + timeout_ms is when the caller stopped waiting)."""
    topics = await fresh_topics(kafka, partitions=1)
    async with _client(kafka, topics, timeout=30.0) as client:
        before_ms = time.time_ns() // 1_000_000
        with pytest.raises(ScoringTimeout) as timed_out:
            await client.score([1, 2], [[3]], label_token_ids=[4], id="late", timeout=0.8)
        after_ms = time.time_ns() // 1_000_000
        with pytest.raises(ScoringTimeout):  # a job's own longer timeout_ms is cut to the call's
            await client.score(
                [1], [[2]], label_token_ids=[3], id="own-longer", timeout_ms=90_000, timeout=0.5
            )
        with pytest.raises(ScoringTimeout):  # and its own shorter one is kept
            await client.score([1], [[2]], label_token_ids=[3], id="own-shorter", timeout_ms=50, timeout=0.5)
    assert isinstance(timed_out.value, TimeoutError) and timed_out.value.job_id == "late"
    records = await read_topic(kafka.bootstrap, topics.requests, lambda rs: len(rs) >= 3, timeout_s=10)
    jobs = {job.id: (job, record) for record in records for job, _ in [decode_job(record.value)]}
    late, record = jobs["late"]
    assert late.timeout_ms == 800
    assert before_ms <= record.timestamp <= after_ms  # the deadline counts from the call's start
    assert jobs["own-longer"][0].timeout_ms == 500
    assert jobs["own-shorter"][0].timeout_ms == 50


@on_each_broker()
async def test_a_rerank_shaped_job_crosses_the_worker(kafka, causal_model, causal_scorer) -> None:
    """SPEC §10 through a real broker and worker: `documents` are scored as the same job's `items`
    (same scores), answered with `results` that echo the documents; a document missing its rank field
    is a typed `invalid_request` naming it."""
    topics = await fresh_topics(kafka, partitions=1)
    documents = ["Rivers run to the sea.", {"title": "Nile", "text": "The longest river.", "n": 3}]
    texts = [documents[0], "Nile\nThe longest river."]
    common = {"query": "Which river is longest?", "label_token_ids": [5, 9], "top_n": 1}
    rerank = Job(id="rr", documents=documents, rank_fields=["title", "text"], return_documents=True, **common)
    missing = Job(id="rr-bad", documents=[{"title": "x"}, {"body": "y"}], rank_fields=["title"], **common)
    async with (
        InProcessWorker(topics.settings(causal_model), causal_scorer.engine),
        _client(kafka, topics) as client,
    ):
        got = await client.score_job(rerank)
        same = await client.score_job(Job(id="items", items=texts, **common))
        failed = await client.request(missing)
    assert got.scores == same.scores and got.ranking is None and same.results is None
    best = max(range(2), key=lambda i: (same.scores[i][0] / sum(same.scores[i]), -i))
    assert [(r.index, r.document) for r in got.results] == [
        (best, documents[best] if best else {"text": documents[0]})
    ]
    assert failed.error is not None and failed.error.code is ErrorCode.INVALID_REQUEST
    assert failed.error.item == 1 and "'title'" in failed.error.message


@on_each_broker()
async def test_a_reply_record_the_client_cannot_parse_is_read_around(
    kafka, causal_model, causal_scorer
) -> None:
    """A record on the reply topic that aiokafka cannot parse (a header name that is not UTF-8, from a
    raw client) raised out of the reply reader's poll: the reader stopped and every waiting call ended
    `ClientClosed`. It is read around now (kafka/unreadable.py), and calls answered on either partition
    get their results."""
    topics = await fresh_topics(kafka, partitions=2)
    async with (
        InProcessWorker(topics.settings(causal_model), causal_scorer.engine),
        _client(kafka, topics) as client,
    ):
        foreign = ['{"not": "a reply"}'] * 3
        await asyncio.to_thread(produce_with_raw_header, kafka.bootstrap, topics.replies, foreign, [1])
        calls = [client.score([1, 2], [[3], [4]], label_token_ids=[5], id=f"after-{i}") for i in range(8)]
        results = await asyncio.wait_for(asyncio.gather(*calls), timeout=60)
    assert [r.id for r in results] == [f"after-{i}" for i in range(8)]
    assert all(r.error is None and len(r.scores) == 2 for r in results)


@on_each_broker()
async def test_a_job_over_the_producers_size_limit_is_not_sent(kafka) -> None:
    topics = await fresh_topics(kafka, partitions=1)
    async with _client(kafka, topics) as client:
        with pytest.raises(NotSent) as refused:
            await client.score("x" * (2 << 20), [[1]], id="huge", timeout=5.0)  # 2 MiB > 1 MiB
    assert refused.value.job_id == "huge" and "MessageSizeTooLarge" in refused.value.reason
    assert refused.value.__cause__ is not None


@on_each_broker()
async def test_a_missing_topic_is_topic_missing_at_start(kafka, monkeypatch) -> None:
    """The embedded broker creates every topic it is asked about, so the broker's refusal is played
    by the producer's metadata call, the one `start` asks."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import UnknownTopicOrPartitionError

    async def unknown(self, topic):
        raise UnknownTopicOrPartitionError(topic)

    monkeypatch.setattr(AIOKafkaProducer, "partitions_for", unknown)
    topics = await fresh_topics(kafka, partitions=1)
    with pytest.raises(TopicMissing) as missing:
        async with _client(kafka, topics):
            pass
    assert missing.value.topic == topics.requests and "does not exist" in str(missing.value)


@on_each_broker()
async def test_closing_the_client_ends_waiting_calls_with_client_closed(kafka) -> None:
    topics = await fresh_topics(kafka, partitions=1)  # no worker: the call waits
    client = await _client(kafka, topics).__aenter__()
    call = asyncio.create_task(client.score([1], [[2]], label_token_ids=[3], timeout=30.0))
    await asyncio.sleep(0.5)
    await client.close()
    with pytest.raises(ClientClosed):
        await call
    with pytest.raises(NotStarted):
        await client.score([1], [[2]], label_token_ids=[3])


@on_each_broker()
async def test_a_reply_reader_failure_reaches_waiting_calls_as_client_closed(kafka, monkeypatch) -> None:
    """Before, the reader's own exception reached the calls raw (not a `ScoringError`)."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import TopicAuthorizationFailedError

    topics = await fresh_topics(kafka, partitions=1)
    async with _client(kafka, topics) as client:
        call = asyncio.create_task(client.score([1], [[2]], label_token_ids=[3], timeout=30.0))
        await asyncio.sleep(0.5)

        async def refused(self, *partitions, timeout_ms=0, max_records=None):
            raise TopicAuthorizationFailedError(topics.replies)

        monkeypatch.setattr(AIOKafkaConsumer, "getmany", refused)
        with pytest.raises(ClientClosed) as closed:
            await call
        with pytest.raises(ClientClosed):  # and every later call, at once
            await client.score([1], [[2]], label_token_ids=[3])
    assert isinstance(closed.value.__cause__, TopicAuthorizationFailedError)


async def test_start_waits_for_a_broker_that_comes_up_within_the_connect_timeout(caplog) -> None:
    port = free_port()
    broker = EmbeddedBroker(port=port)

    async def later() -> None:
        await asyncio.sleep(1.5)
        broker.start()  # on the loop's thread: its parent-death signal (embedded/broker.py)

    starting = asyncio.create_task(later())
    try:
        async with ScoringClient(f"127.0.0.1:{port}", "requests", "replies", connect_timeout=60) as client:
            assert client.resets == 0
        await starting
    finally:
        broker.stop(timeout_s=0.2)
    said = [r.getMessage() for r in caplog.records if "the client retries for up to 60s" in r.getMessage()]
    assert len(said) == 1
