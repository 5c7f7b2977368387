"""Process lifecycle, with `kafka-scorer worker` as a real child process: SIGKILL mid-stream and a
restart lose nothing; SIGTERM answers and commits everything in flight before the process exits."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections import Counter

import pytest

from kafka_scorer.protocol import decode_job, decode_result
from tests.integration.jobs import Reference, assert_matches_reference, expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import (
    WorkerProcess,
    committed_offsets,
    create_topics,
    produce,
    read_topic,
    unique,
    wait_for_commits,
    worker_settings,
)

pytestmark = pytest.mark.integration


def _decode(records) -> list:
    return [decode_result(r.value, dict(r.headers)["content-type"].decode()) for r in records]


async def _results(
    bootstrap: str, topic: str, distinct: int, timeout_s: float, settle_s: float = 0.0
) -> list:
    """Results read back until `distinct` different job ids are among them."""

    def enough(records) -> bool:
        return len({r.id for r in _decode(records)}) >= distinct if len(records) >= distinct else False

    return _decode(await read_topic(bootstrap, topic, enough, timeout_s, settle_s=settle_s))


async def _wait_for_results(
    bootstrap: str, topic: str, distinct: int, worker: WorkerProcess, timeout_s: float
):
    deadline = time.monotonic() + timeout_s
    while True:
        results = await _results(bootstrap, topic, distinct, timeout_s=1.0)
        if len({r.id for r in results}) >= distinct:
            return results
        if worker.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{len(results)} results; worker log:\n{worker.output()[-4000:]}")
        await asyncio.sleep(0.1)


async def test_sigkill_mid_stream_and_restart_answers_every_job(kafka, causal_model, causal_scorer) -> None:
    requests, replies, group = unique("req"), unique("res"), unique("group")
    await create_topics(kafka.bootstrap, [requests, replies], partitions=3)
    sent = mixed_jobs(240, seed=21, model_name=causal_scorer.model_name, prefix="kill")
    records = [to_record(s, requests, partition=i % 3, with_content_type=True) for i, s in enumerate(sent)]
    settings = worker_settings(
        kafka,
        causal_model,
        request_topics=[requests],
        reply_topic=replies,
        group_id=group,
        max_batch_tokens=64,
    )

    first = WorkerProcess(settings, "killed")
    try:
        await first.wait_for_log("worker ready")
        await produce(kafka.bootstrap, records[:160])
        before_kill = await _wait_for_results(kafka.bootstrap, replies, 20, first, timeout_s=60)
        first.signal(signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
    finally:
        first.close()
    await produce(kafka.bootstrap, records[160:])  # arrives while no worker runs

    second = WorkerProcess(settings, "restarted")
    try:
        await second.wait_for_log("worker ready")
        results = await _wait_for_results(kafka.bootstrap, replies, len(sent), second, timeout_s=120)
        committed, ends = await wait_for_commits(kafka.bootstrap, group, requests, 3, len(sent))
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0
    finally:
        second.close()

    counts = Counter(r.id for r in results)
    duplicates = sum(c - 1 for c in counts.values())
    print(f"sigkill: {len(before_kill)} results before the kill, {duplicates} duplicates after the restart")
    by_id = {expected_id(s): s for s in sent}
    assert set(counts) == set(by_id), f"lost: {sorted(set(by_id) - set(counts))[:10]}"
    reference = Reference(causal_model)
    for result in results:
        assert_matches_reference(result, by_id[result.id], reference)
    assert committed == ends


async def test_sigterm_answers_and_commits_all_in_flight_work_before_exit(
    kafka, causal_model, causal_scorer
) -> None:
    requests, replies, group = unique("req"), unique("res"), unique("group")
    await create_topics(kafka.bootstrap, [requests, replies], partitions=3)
    sent = mixed_jobs(300, seed=31, model_name=causal_scorer.model_name, prefix="term")
    records = [to_record(s, requests, partition=i % 3, with_content_type=True) for i, s in enumerate(sent)]
    settings = worker_settings(
        kafka,
        causal_model,
        request_topics=[requests],
        reply_topic=replies,
        group_id=group,
        max_batch_tokens=48,
        max_inflight_tokens=300,  # holds part of the backlog, so some is in flight and some not yet fetched
        max_poll_records=20,
    )
    worker = WorkerProcess(settings, "terminated")
    try:
        await worker.wait_for_log("worker ready")
        await produce(kafka.bootstrap, records)
        await _wait_for_results(kafka.bootstrap, replies, 10, worker, timeout_s=60)
        worker.signal(signal.SIGTERM)
        assert await worker.wait(timeout_s=settings.shutdown_grace_s + 15) == 0
        log = worker.output()
    finally:
        worker.close()

    in_flight = int(re.search(r"stopping: (\d+) jobs in flight", log).group(1))
    assert in_flight > 0, "the signal should have found work in flight"
    assert "grace period over" not in log
    assert "worker stopped cleanly" in log

    committed = await committed_offsets(kafka.bootstrap, group, requests, 3)
    requests_read = await read_topic(kafka.bootstrap, requests, lambda rs: len(rs) >= len(sent), timeout_s=30)
    consumed = set()
    for record in requests_read:
        if record.offset < (committed[record.partition] or 0):
            job, _ = decode_job(record.value, "application/json" if record.value[:1] == b"{" else None)
            consumed.add(job.id or dict(record.headers)["correlation_id"].decode())
    results = await _results(kafka.bootstrap, replies, len(consumed), timeout_s=10, settle_s=0.5)
    counts = Counter(r.id for r in results)
    print(
        f"sigterm: {in_flight} in flight at the signal; {len(consumed)} of {len(sent)} consumed and committed"
    )
    # Everything answered is committed, everything committed is answered, exactly once; no more.
    assert set(counts) == consumed
    assert max(counts.values()) == 1
    assert len(consumed) < len(sent), "the worker should have stopped fetching when signalled"
    by_id = {expected_id(s): s for s in sent}
    reference = Reference(causal_model)
    for result in results:
        assert_matches_reference(result, by_id[result.id], reference)
