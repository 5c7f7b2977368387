"""A device error that poisons the process (CUDA's illegal memory access, injected on CPU): the worker
stops non-zero, commits nothing it did not answer, and its probes turn red on the way out."""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kafka_scorer.embedded.broker import free_port
from tests.integration.jobs import expected_id, mixed_stream
from tests.integration.kafka_helpers import (
    InProcessWorker,
    WorkerProcess,
    committed_offsets,
    decode_replies,
    produce,
    read_topic,
)

pytestmark = pytest.mark.integration

FAULTS = Path(__file__).parent / "fault_injection"


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


async def _answered_ids(stream, timeout_s: float = 3.0) -> set[str]:
    records = await read_topic(stream.broker.bootstrap, stream.replies, lambda rs: False, timeout_s=timeout_s)
    return {r.id for r in decode_replies(records)}


def _unanswered_below_commit(stream, committed: dict[int, int | None], answered: set[str]) -> list[str]:
    """Jobs at offsets the group committed past that have no answer: must be none (SPEC §7). Records
    went out in order, record i to partition i % partitions, so position i // partitions is its offset."""
    missing = []
    for i, sent in enumerate(stream.sent):
        partition, offset = i % stream.partitions, i // stream.partitions
        if offset < (committed[partition] or 0) and expected_id(sent) not in answered:
            missing.append(expected_id(sent))
    return missing


async def test_a_poisoned_device_stops_the_worker_non_zero_without_committing_unanswered_jobs(
    kafka, causal_model, causal_scorer
) -> None:
    stream = await mixed_stream(
        kafka, 60, seed=61, model_name=causal_scorer.describe().model_name, prefix="fault"
    )
    settings = stream.settings(causal_model, max_batch_tokens=64)
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAULTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "SCORER_TEST_DEVICE_FAULT_AFTER": "1",  # one served forward, then the device is gone
    }
    async with WorkerProcess(settings, "device-fault", extra_env=env) as worker:
        await produce(kafka.bootstrap, stream.records)
        rc = await worker.wait(timeout_s=90)
    log = worker.output()

    assert rc == 1, log[-3000:]
    assert "FAULT-INJECTION: illegal memory access in forward" in log
    assert (
        "worker stopped after a fatal error" in log
        and "illegal memory access" in log.split("fatal error")[-1]
    )
    committed = await committed_offsets(kafka.bootstrap, stream.group, stream.requests, stream.partitions)
    answered = await _answered_ids(stream)
    assert not _unanswered_below_commit(stream, committed, answered), (committed, log[-3000:])
    assert len(answered) < len(stream.sent), "the fault should have left jobs unanswered"
    print(
        f"device fault: {len(answered)} of {len(stream.sent)} answered before the stop, committed {committed}"
    )


async def test_probes_turn_red_when_the_device_is_poisoned(
    kafka, causal_model, causal_scorer, monkeypatch
) -> None:
    stream = await mixed_stream(
        kafka, 6, seed=62, model_name=causal_scorer.describe().model_name, prefix="red"
    )
    port = free_port()

    def poisoned(batch):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(causal_scorer.describe().runner, "forward", poisoned)
    async with InProcessWorker(
        stream.settings(causal_model, metrics_port=port), causal_scorer.engine
    ) as worker:
        assert await asyncio.to_thread(_status, f"http://127.0.0.1:{port}/readyz") == 200
        leave = worker.worker.consumer.stop
        probed = asyncio.Event()

        async def stop_after_the_probes() -> None:  # hold the exit until the probes were read
            await probed.wait()
            await leave()

        monkeypatch.setattr(worker.worker.consumer, "stop", stop_after_the_probes)
        await produce(kafka.bootstrap, stream.records)
        for _ in range(300):
            if await asyncio.to_thread(_status, f"http://127.0.0.1:{port}/healthz") == 503:
                break
            await asyncio.sleep(0.1)
        health = await asyncio.to_thread(_status, f"http://127.0.0.1:{port}/healthz")
        ready = await asyncio.to_thread(_status, f"http://127.0.0.1:{port}/readyz")
        probed.set()
        rc = await worker.stop()
    assert (health, ready, rc) == (503, 503, 1)
    committed = await committed_offsets(kafka.bootstrap, stream.group, stream.requests, stream.partitions)
    assert not _unanswered_below_commit(stream, committed, await _answered_ids(stream))
