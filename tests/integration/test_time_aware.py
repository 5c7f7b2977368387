"""Time-aware serving against the real broker (issue 18): a backlog of bulk jobs does not hold back the
interactive jobs that arrive behind it, expired jobs are answered `deadline_exceeded` without a forward
pass, a client's timeout becomes its job's deadline, and nothing is lost or committed past an
unanswered record. Asserted by order and counts (the engine counts what it ran), never by wall clock."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from kafka_scorer.client import ScoringClient, ScoringTimeout
from kafka_scorer.testing.broker import create_topics
from kafka_scorer.wire.protocol import ErrorCode, Job, Result, encode_job
from tests.integration.kafka_helpers import (
    InProcessWorker,
    Out,
    committed_offsets,
    decode_replies,
    produce,
    read_topic,
    unique,
)

pytestmark = pytest.mark.integration

N_BULK = 1500
N_LIVE = 20
BULK_TOKENS = 24 + 6 * 24  # one packed sequence: the query once, then six items


class CountingEngine:
    """The real engine, noting the id of every job that reaches a forward pass."""

    def __init__(self, scorer: Any) -> None:
        self.scorer = scorer
        self.ran: list[str] = []
        self.served = scorer.served

    def prepare(self, job: Job, job_id: str) -> Any:
        return self.scorer.prepare(job, job_id)

    def pack(self, jobs: Sequence[Any]) -> Any:
        return self.scorer.pack(jobs)

    def run_packed(self, packed: Any) -> list[Result]:
        self.ran.extend(job.job_id for job in packed.jobs)
        return self.scorer.run_packed(packed)


def _job(job_id: str, rng: random.Random, **fields: Any) -> bytes:
    query = [rng.randrange(4, 380) for _ in range(24)]
    items = [[rng.randrange(4, 380) for _ in range(24)] for _ in range(6)]
    return encode_job(Job(id=job_id, query=query, items=items, label_token_ids=[3, 77], **fields))


async def _topics(kafka) -> tuple[str, str, str]:
    bulk, live, replies = unique("bulk"), unique("live"), unique("res")
    await create_topics(kafka.bootstrap, [bulk, live, replies], 1)
    return bulk, live, replies


async def test_interactive_jobs_overtake_a_bulk_backlog_and_expired_ones_are_not_computed(
    kafka, causal_model, causal_scorer
) -> None:
    bulk, live, replies = await _topics(kafka)
    rng = random.Random(18)
    backlog = [Out(bulk, _job(f"bulk-{i}", rng), key=b"b") for i in range(N_BULK)]
    # Behind the backlog in the same partition, jobs that will have expired by the time they are read.
    stale = [Out(bulk, _job(f"stale-{i}", rng, timeout_ms=300), key=b"b") for i in range(5)]
    await produce(kafka.bootstrap, backlog + stale)
    engine = CountingEngine(causal_scorer)
    settings = _settings(kafka, causal_model, bulk, live, replies)
    async with InProcessWorker(settings, engine) as worker:
        await _until(lambda: len(engine.ran) >= 50)  # the backlog is being worked through
        await produce(
            kafka.bootstrap, [Out(live, _job(f"live-{i}", rng, timeout_ms=60_000)) for i in range(N_LIVE)]
        )
        arrived = len(engine.ran)  # forwards run before the live jobs could have been read
        records = await read_topic(kafka.bootstrap, replies, lambda rs: len(rs) >= N_BULK + 5 + N_LIVE, 180)
        assert await worker.stop() == 0
    results = decode_replies(sorted(records, key=lambda r: (r.timestamp, r.offset)))
    ids = [r.id for r in results]
    assert sorted(ids) == sorted(
        [f"bulk-{i}" for i in range(N_BULK)]
        + [f"stale-{i}" for i in range(5)]
        + [f"live-{i}" for i in range(N_LIVE)]
    ), "one answer each"
    # Between their arrival and the last of them, only the bulk jobs already packed or on the device
    # (two batches) and those batched beside them may run: not the queue the backlog keeps full.
    last_live = max(i for i, job_id in enumerate(engine.ran) if job_id.startswith("live-"))
    bulk_between = sum(1 for job_id in engine.ran[arrived : last_live + 1] if job_id.startswith("bulk-"))
    queued_bulk = settings.max_inflight_tokens // BULK_TOKENS
    assert bulk_between < queued_bulk // 3, f"{bulk_between} bulk jobs ran first (about {queued_bulk} queued)"
    stale = {r.id: r for r in results if r.id.startswith("stale-")}
    assert all(r.error is not None and r.error.code is ErrorCode.DEADLINE_EXCEEDED for r in stale.values())
    assert not set(stale) & set(engine.ran), "an expired job reached a forward pass"
    assert all(r.error is None for r in results if not r.id.startswith("stale-"))
    committed = await committed_offsets(kafka.bootstrap, settings.group_id, bulk, 1)
    assert committed == {0: N_BULK + 5}, "every record answered and committed, none skipped"


async def test_a_client_timeout_is_the_jobs_deadline_and_the_worker_skips_its_forward(
    kafka, causal_model, causal_scorer
) -> None:
    bulk, live, replies = await _topics(kafka)
    rng = random.Random(7)
    await produce(kafka.bootstrap, [Out(bulk, _job(f"bulk-{i}", rng), key=b"b") for i in range(N_BULK)])
    engine = CountingEngine(causal_scorer)
    settings = _settings(kafka, causal_model, bulk, live, replies)
    client = ScoringClient(kafka.bootstrap, bulk, replies, fetch_max_wait_ms=20)
    async with client, InProcessWorker(settings, engine) as worker:
        await _until(lambda: len(engine.ran) >= 20)
        with pytest.raises(ScoringTimeout):
            await client.score_job(
                Job(id="abandoned", query=[5, 6], items=[[7]], label_token_ids=[3]), timeout=0.2
            )
        records = await read_topic(
            kafka.bootstrap, replies, lambda rs: any(_id(r) == "abandoned" for r in rs), 180
        )
        assert await worker.stop() == 0
    (answer,) = [r for r in decode_replies(records) if r.id == "abandoned"]
    assert answer.error is not None and answer.error.code is ErrorCode.DEADLINE_EXCEEDED
    assert "abandoned" not in engine.ran


def _id(record) -> str:
    return msgspec.json.decode(record.value).get("id", "")


def _settings(kafka, model, bulk: str, live: str, replies: str):
    from tests.integration.kafka_helpers import worker_settings

    return worker_settings(
        kafka,
        model,
        request_topics=[bulk, live],
        reply_topic=replies,
        group_id=unique("group"),
        topic_priorities=f"{bulk}=-1,{live}=1",
        max_inflight_tokens=60_000,  # the worker holds hundreds of bulk jobs queued
        max_batch_tokens=2048,
        max_poll_records=50,
    )


async def _until(condition, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)
