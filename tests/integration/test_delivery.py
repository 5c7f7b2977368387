"""500 jobs from 3 partitions, every code path mixed: one result each, reference scores, full commits."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from kafka_scorer.embedded.broker import free_port
from kafka_scorer.wire.protocol import CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK
from tests.integration.jobs import assert_answers, expected_id, mixed_stream
from tests.integration.kafka_helpers import InProcessWorker, decode_replies, produce

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
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    stream = await mixed_stream(
        kafka, N_JOBS, seed=1, model_name=causal_scorer.describe().model_name, prefix="job", bare_every=4
    )
    by_id = {expected_id(s): s for s in stream.sent}
    assert len(by_id) == N_JOBS
    port = free_port()
    settings = stream.settings(causal_model, metrics_port=port)

    async with InProcessWorker(settings, causal_scorer.engine) as worker:
        assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/readyz"))[0] == 200
        await produce(kafka.bootstrap, stream.records)
        got = await stream.read_replies(N_JOBS, timeout_s=90, settle_s=0.5)
        committed, ends = await stream.wait_for_commits(N_JOBS)
        status, metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        lags = await _lags_once_settled(port)
        assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/healthz"))[0] == 200
        rc = await worker.stop()
    assert rc == 0

    results = decode_replies(got)
    for record, result in zip(got, results, strict=True):
        job = by_id[result.id]
        assert record.key == job.key
        headers = dict(record.headers)
        want_type = CONTENT_TYPE_JSON if job.fmt == "json" else CONTENT_TYPE_MSGPACK
        assert headers["content-type"].decode() == want_type
        if job.correlation is not None:
            assert headers["correlation_id"] == job.correlation
        assert result.model == causal_scorer.describe().model_name
    assert_answers(results, stream.sent, causal_reference)
    assert committed == ends and sum(ends.values()) == N_JOBS
    assert _metric(metrics, "kafka_scorer_jobs_total") == N_JOBS
    assert _metric(metrics, "kafka_scorer_batches_total") >= 1
    assert _metric(metrics, "kafka_scorer_inflight_tokens") == 0
    assert 'kind="causal_lm"' in metrics and 'device="cpu"' in metrics and 'dtype="float32"' in metrics
    assert lags == dict.fromkeys(range(3), 0.0)  # every partition's lag series, down to nothing left


async def _lags_once_settled(port: int, timeout_s: float = 10.0) -> dict[int, float]:
    """kafka_scorer_consumer_lag per partition, read until all are 0 (the gauge follows the next poll
    after the last commit) or the time is up."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        _, text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        lags = {
            int(line.split('partition="')[1].split('"')[0]): float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("kafka_scorer_consumer_lag{")
        }
        if (lags and not any(lags.values())) or asyncio.get_running_loop().time() > deadline:
            return lags
        await asyncio.sleep(0.2)


async def test_exactly_once_degrades_with_a_clear_log_line_where_the_broker_refuses_transactions(
    kafka, causal_model, causal_scorer, causal_reference, caplog
) -> None:
    if kafka.transactions:
        pytest.skip(f"the session broker ({kafka.name}) grants transactions; nothing degrades there")
    stream = await mixed_stream(
        kafka, 5, seed=9, model_name=causal_scorer.describe().model_name, prefix="degraded", partitions=1
    )
    settings = stream.settings(causal_model, delivery="exactly_once")
    with caplog.at_level("INFO", logger="kafka_scorer"):
        async with InProcessWorker(settings, causal_scorer.engine) as worker:
            assert worker.worker.producer.mode == "plain"
            await produce(kafka.bootstrap, stream.records)
            got = await stream.read_replies(len(stream.sent), timeout_s=30)
    refusals = [r for r in caplog.records if "refused transactions" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelname == "ERROR"
    assert "degrades to at-least-once" in refusals[0].getMessage()
    assert_answers(decode_replies(got), stream.sent, causal_reference, once=False)
