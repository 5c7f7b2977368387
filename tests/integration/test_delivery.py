"""500 jobs from 3 partitions, every code path mixed: one result each, reference scores, full commits."""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter

import pytest

from kafka_scorer.broker import free_port
from kafka_scorer.protocol import CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK, decode_result
from tests.integration.jobs import Reference, assert_matches_reference, expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import (
    InProcessWorker,
    create_topics,
    produce,
    read_topic,
    unique,
    wait_for_commits,
    worker_settings,
)

pytestmark = pytest.mark.integration

N_JOBS = 500


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def test_every_job_answered_once_with_reference_scores_and_offsets_committed(
    kafka, causal_model, causal_scorer
) -> None:
    requests, replies, group = unique("req"), unique("res"), unique("group")
    await create_topics(kafka.bootstrap, [requests, replies], partitions=3)
    port = free_port()
    settings = worker_settings(
        kafka, causal_model, request_topics=[requests], reply_topic=replies, group_id=group, metrics_port=port
    )
    sent = mixed_jobs(N_JOBS, seed=1, model_name=causal_scorer.model_name)
    by_id = {expected_id(s): s for s in sent}
    assert len(by_id) == N_JOBS

    async with InProcessWorker(settings, causal_scorer) as worker:
        assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/readyz"))[0] == 200
        records = [
            to_record(s, requests, partition=i % 3, with_content_type=i % 4 != 0) for i, s in enumerate(sent)
        ]
        await produce(kafka.bootstrap, records)
        got = await read_topic(
            kafka.bootstrap, replies, lambda rs: len(rs) >= N_JOBS, timeout_s=90, settle_s=0.5
        )
        committed, ends = await wait_for_commits(kafka.bootstrap, group, requests, 3, N_JOBS)
        status, metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/healthz"))[0] == 200
        rc = await worker.stop()
    assert rc == 0

    counts = Counter()
    reference = Reference(causal_model)
    for record in got:
        headers = dict(record.headers)
        result = decode_result(record.value, headers["content-type"].decode())
        counts[result.id] += 1
        job = by_id[result.id]
        assert record.key == job.key
        want_type = CONTENT_TYPE_JSON if job.fmt == "json" else CONTENT_TYPE_MSGPACK
        assert headers["content-type"].decode() == want_type
        if job.correlation is not None:
            assert headers["correlation_id"] == job.correlation
        assert result.model == causal_scorer.model_name
        assert_matches_reference(result, job, reference)
    assert set(counts) == set(by_id), f"missing: {sorted(set(by_id) - set(counts))[:10]}"
    assert max(counts.values()) == 1, f"answered twice: {[k for k, v in counts.items() if v > 1][:10]}"
    assert committed == ends and sum(ends.values()) == N_JOBS
    assert _metric(metrics, "kafka_scorer_jobs_total") == N_JOBS
    assert _metric(metrics, "kafka_scorer_batches_total") >= 1
    assert _metric(metrics, "kafka_scorer_inflight_tokens") == 0


async def test_exactly_once_degrades_with_a_clear_log_line_where_the_broker_refuses_transactions(
    kafka, causal_model, causal_scorer, caplog
) -> None:
    if kafka.transactions:
        pytest.skip(f"the session broker ({kafka.name}) grants transactions; nothing degrades there")
    requests, replies, group = unique("req"), unique("res"), unique("group")
    await create_topics(kafka.bootstrap, [requests, replies], partitions=1)
    settings = worker_settings(
        kafka,
        causal_model,
        request_topics=[requests],
        reply_topic=replies,
        group_id=group,
        delivery="exactly_once",
    )
    sent = mixed_jobs(5, seed=9, model_name=causal_scorer.model_name, prefix="degraded")
    with caplog.at_level("INFO", logger="kafka_scorer"):
        async with InProcessWorker(settings, causal_scorer) as worker:
            assert worker.worker.producer.mode == "plain"
            await produce(kafka.bootstrap, [to_record(s, requests, 0, True) for s in sent])
            got = await read_topic(kafka.bootstrap, replies, lambda rs: len(rs) >= len(sent), timeout_s=30)
    refusals = [r for r in caplog.records if "refused transactions" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelname == "ERROR"
    assert "degrades to at-least-once" in refusals[0].getMessage()
    reference = Reference(causal_model)
    by_id = {expected_id(s): s for s in sent}
    for record in got:
        result = decode_result(record.value)
        assert_matches_reference(result, by_id[result.id], reference)
    assert {decode_result(r.value).id for r in got} == set(by_id)
