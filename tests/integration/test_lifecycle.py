"""Process lifecycle, with `kafka-scorer worker` as a real child process: SIGKILL mid-stream and a
restart lose nothing; SIGTERM answers and commits everything in flight before the process exits."""

from __future__ import annotations

import re
import signal

import pytest

from kafka_scorer.wire.protocol import decode_job
from tests.integration.jobs import assert_answers, mixed_stream
from tests.integration.kafka_helpers import WorkerProcess, committed_offsets, gated, produce, read_topic

pytestmark = pytest.mark.integration


async def test_sigkill_mid_stream_and_restart_answers_every_job(
    kafka, causal_model, causal_scorer, causal_reference, tmp_path
) -> None:
    stream = await mixed_stream(
        kafka, 240, seed=21, model_name=causal_scorer.describe().model_name, prefix="kill"
    )
    settings = stream.settings(causal_model, max_batch_tokens=64)
    gate = tmp_path / "restart-gate"
    # The restart's process loads its model meanwhile; its Kafka clients wait for the gate (fault_injection)
    restart = WorkerProcess(settings, "restarted", extra_env=gated(gate))

    try:
        async with WorkerProcess(settings, "killed") as first:
            await produce(kafka.bootstrap, stream.records[:160])
            before_kill = await stream.wait_for_answers(20, first, timeout_s=60)
            first.signal(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        await produce(kafka.bootstrap, stream.records[160:])  # arrives while no worker is connected
        gate.touch()
    except BaseException:
        restart.close()
        raise

    async with restart as second:
        results = await stream.wait_for_answers(len(stream.sent), second, timeout_s=120)
        committed, ends = await stream.wait_for_commits(len(stream.sent))
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0

    # At-least-once across a SIGKILL: duplicates are allowed, losses are not.
    counts = assert_answers(results, stream.sent, causal_reference, once=False)
    duplicates = sum(c - 1 for c in counts.values())
    print(f"sigkill: {len(before_kill)} results before the kill, {duplicates} duplicates after the restart")
    assert committed == ends


async def test_sigterm_answers_and_commits_all_in_flight_work_before_exit(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    stream = await mixed_stream(
        kafka, 300, seed=31, model_name=causal_scorer.describe().model_name, prefix="term"
    )
    settings = stream.settings(
        causal_model,
        max_batch_tokens=48,
        max_inflight_tokens=300,  # holds part of the backlog, so some is in flight and some not yet fetched
        max_poll_records=20,
    )
    async with WorkerProcess(settings, "terminated") as worker:
        await produce(kafka.bootstrap, stream.records)
        await stream.wait_for_answers(10, worker, timeout_s=60)
        worker.signal(signal.SIGTERM)
        assert await worker.wait(timeout_s=settings.shutdown_grace_s + 15) == 0
    log = worker.output()

    in_flight = int(re.search(r"stopping: (\d+) jobs in flight", log).group(1))
    assert in_flight > 0, "the signal should have found work in flight"
    assert "grace period over" not in log
    assert "worker stopped cleanly" in log
    assert "leaked" not in log and "nanobind" not in log, "a CPU worker's exit reports no native leaks"

    sent = stream.sent
    committed = await committed_offsets(kafka.bootstrap, stream.group, stream.requests, stream.partitions)
    requests_read = await read_topic(
        kafka.bootstrap, stream.requests, lambda rs: len(rs) >= len(sent), timeout_s=30
    )
    consumed = set()
    for record in requests_read:
        if record.offset < (committed[record.partition] or 0):
            job, _ = decode_job(record.value, "application/json" if record.value[:1] == b"{" else None)
            consumed.add(job.id or dict(record.headers)["correlation_id"].decode())
    results = await stream.read_answers(len(consumed), timeout_s=10, settle_s=0.5)
    print(
        f"sigterm: {in_flight} in flight at the signal; {len(consumed)} of {len(sent)} consumed and committed"
    )
    # Everything answered is committed, everything committed is answered, exactly once; no more.
    assert_answers(results, sent, causal_reference, expected=consumed)
    assert len(consumed) < len(sent), "the worker should have stopped fetching when signalled"
