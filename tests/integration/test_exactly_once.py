"""Exactly-once mode across a crash with a transaction open: a `read_committed` reader sees each
result once.

The first worker is made to hang inside a commit (fault_injection/sitecustomize.py) and is then
SIGKILLed, so the crash always leaves results and offsets sent in a transaction that never commits;
the restarted worker, with the same transactional id, fences it, and must redo exactly that work.

Runs on a broker with transactions: the session broker when it has them (testcontainers, or
KAFKA_BOOTSTRAP_SERVERS), else noida-db; the `transactional_kafka` fixture skips with the reason when
none is available (the embedded tansu refuses aiokafka's transactional producer).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.integration.jobs import assert_answers, mixed_stream
from tests.integration.kafka_helpers import WorkerProcess, produce, read_topic

pytestmark = pytest.mark.integration

FAULTS = Path(__file__).parent / "fault_injection"


async def test_read_committed_reader_sees_each_result_once_across_a_crash(
    transactional_kafka, causal_model, causal_scorer, causal_reference
) -> None:
    kafka = transactional_kafka
    stream = await mixed_stream(kafka, 200, seed=41, model_name=causal_scorer.model_name, prefix="eos")
    settings = stream.settings(
        causal_model,
        delivery="exactly_once",
        client_id="eos-worker",  # same transactional id after the restart: it fences the killed one
        group_instance_id="eos-worker-0",  # static membership: the restart takes the partitions back at once
        max_batch_tokens=64,
    )

    hang = {"PYTHONPATH": os.pathsep.join([str(FAULTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    hang["SCORER_TEST_HANG_IN_COMMIT_AFTER"] = "5"
    async with WorkerProcess(settings, "eos-killed", extra_env=hang) as first:
        assert "producer started (transactional" in first.output()
        await produce(kafka.bootstrap, stream.records)
        await first.wait_for_log("FAULT-INJECTION: hanging in commit_transaction", timeout_s=120)
        first.signal(signal.SIGKILL)
        await first.wait()

    async with WorkerProcess(settings, "eos-restarted") as second:
        assert "producer started (transactional" in second.output(), second.output()[-3000:]
        # Read once the restarted worker has committed everything, with a reader started then. On
        # noida-db, an aiokafka read_committed reader that is already fetching while the restart aborts
        # the killed worker's open transaction stops seeing that producer's later, committed records (a
        # reader started afterwards sees them all, and the last stable offset is right: measured with
        # both readers side by side), so reading earlier would test the broker's and the client's fetch
        # path, not the worker.
        committed, ends = await stream.wait_for_commits(len(stream.sent), timeout_s=120)
        got = await stream.read_answers(len(stream.sent), timeout_s=120, settle_s=1.0, committed_only=True)
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0, second.output()[-4000:]

    everything = await read_topic(kafka.bootstrap, stream.replies, lambda rs: False, timeout_s=2.0)
    print(f"exactly-once on {kafka.name}: {len(got)} committed results, {len(everything)} records in the log")
    logs = f"killed worker:\n{first.output()[-3000:]}\nrestarted worker:\n{second.output()[-3000:]}"
    assert_answers(got, stream.sent, causal_reference, context=f"\n{logs}")
    # The killed transaction's results are in the log, hidden from read_committed: the crash really
    # left a transaction open, and the fence aborted it.
    assert len(everything) > len(stream.sent), f"no aborted results in the log\n{logs}"
    assert committed == ends
