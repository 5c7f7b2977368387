"""Exactly-once mode across crashes with a transaction open: a `read_committed` reader sees each result
once.

A worker is made to hang inside a commit (fault_injection/sitecustomize.py) and is then SIGKILLed, so
the crash always leaves results and offsets sent in a transaction that never commits; the restarted
worker, with the same transactional id, fences it, and must redo exactly that work. Part of the chaos
suite (test_chaos.py): bounded in time, with a printed tally, on events, not on a clock.

The committed results are read back by aiokafka and then by two clients that share none of its code,
kafka-python and confluent-kafka (independent_readers.py): each must see every job exactly once.

Runs on a broker with transactions: the session broker when it has them (testcontainers, or
KAFKA_BOOTSTRAP_SERVERS), else noida-db; the `transactional_kafka` fixture skips with the reason when
none is available (the embedded tansu refuses aiokafka's transactional producer). And on Apache Kafka
(`on_each_broker`), where fencing, aborts and read_committed are the reference implementation's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time

import pytest

from kafka_scorer.embedded.broker import free_port
from kafka_scorer.wire.protocol import Result
from tests.integration.brokers import on_each_broker
from tests.integration.chaos import ATOL, gauge, get_text, tally, templated_jobs
from tests.integration.independent_readers import READERS
from tests.integration.jobs import Reference, Sent, assert_matches_reference, expected_id, to_record
from tests.integration.kafka_helpers import WorkerProcess, fresh_topics, gated, produce, read_topic

pytestmark = [
    pytest.mark.integration,
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy calls
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

EOS_JOBS, EOS_SEED = 300, 1205


async def _assert_independent_readers_agree(
    bootstrap: str, topic: str, aiokafka_read: list[Result], sent: list[Sent], reference: Reference
) -> None:
    """kafka-python and confluent-kafka, reading with `read_committed`, see every job once, each result
    byte for byte what aiokafka read: aborted transactions are hidden by each client's own code."""
    want = {r.id: r for r in aiokafka_read}
    for name, read in READERS.items():
        got = await asyncio.to_thread(read, bootstrap, topic, EOS_JOBS)
        result = tally(f"exactly-once read by {name}", got, sent, reference)
        assert result.clean and result.duplicated == 0, result.report()
        assert {r.id: r for r in got} == want, f"{name} read other results than aiokafka"


async def _jobs_answered(port: int) -> float:
    with contextlib.suppress(OSError):
        return gauge(
            await asyncio.to_thread(get_text, f"http://127.0.0.1:{port}/metrics"), "kafka_scorer_jobs_total"
        )
    return 0.0


@on_each_broker("transactional_kafka")
async def test_exactly_once_under_repeated_sigkills_shows_each_result_once_to_a_read_committed_reader(
    transactional_kafka, causal_model, causal_scorer, causal_reference, tmp_path
) -> None:
    """Three crashes, then a clean stop: twice inside a commit (fault injection: results and offsets sent,
    EndTxn not, so a transaction is always left open) and once at a seeded point of the stream. Each
    restart has the same transactional id and static member id, fences its predecessor and redoes the
    aborted work; a read_committed reader must see every result exactly once.

    The first step is the single crash this file once tested on its own, with all of its checks: the
    transactional producer, each result once and as the reference scores it (pooled hidden states too),
    the aborted results in the log, the commits at the ends.

    Each restart's process starts while the step before runs, and its Kafka clients wait for a gate the
    test opens once its predecessor is dead (fault_injection: SCORER_TEST_START_GATE): the restart fences
    a dead worker as before, and the model loads are paid alongside the steps, not between them."""
    kafka = transactional_kafka
    topics = await fresh_topics(kafka, partitions=3)
    sent = templated_jobs(
        EOS_JOBS, EOS_SEED, causal_scorer.describe().model_name, prefix="eos-chaos", pooled_every=20
    )
    rng = random.Random(EOS_SEED)
    plan = [
        ("hang", rng.randint(2, 6)),
        ("hang", rng.randint(2, 6)),
        ("kill", rng.randint(20, 80)),
        ("run", 0),
    ]
    base = topics.settings(
        causal_model,
        delivery="exactly_once",
        client_id="eos-chaos",  # one transactional id across restarts: each fences the one before
        group_instance_id="eos-chaos-0",  # static member: a restart takes the partitions back at once
        max_batch_tokens=64,
    )
    await produce(kafka.bootstrap, [to_record(s, topics.requests, i % 3, True) for i, s in enumerate(sent)])
    ports: dict[int, int] = {}

    def spawn(step: int) -> WorkerProcess:
        """Step `step`'s worker, its Kafka clients held until its gate opens (fault_injection)."""
        fault, n = plan[step]
        hang = {"SCORER_TEST_HANG_IN_COMMIT_AFTER": str(n)} if fault == "hang" else {}
        env = gated(tmp_path / f"gate-{step}", **hang)
        ports[step] = free_port()
        settings = base.model_copy(update={"metrics_port": ports[step]})
        return WorkerProcess(settings, f"eos-chaos-{step}", extra_env=env)

    workers: list[WorkerProcess] = [spawn(0)]
    try:
        for step, (fault, n) in enumerate(plan):
            worker = workers[step]
            (tmp_path / f"gate-{step}").touch()  # its predecessor is dead: it may fence it now
            if step + 1 < len(plan):
                workers.append(spawn(step + 1))  # the next restart loads its model meanwhile
            await worker.wait_for_log("worker ready", timeout_s=120)
            assert "producer started (transactional" in worker.output(), worker.output()[-3000:]
            if fault == "hang":
                await worker.wait_for_log("FAULT-INJECTION: hanging in commit_transaction", timeout_s=120)
            elif fault == "kill":
                deadline = time.monotonic() + 120
                while await _jobs_answered(ports[step]) < n:
                    assert worker.proc.poll() is None and time.monotonic() < deadline, worker.output()[-3000:]
                    await asyncio.sleep(0.05)
            if fault != "run":
                worker.signal(signal.SIGKILL)
                assert await worker.wait() == -signal.SIGKILL
        # The last worker finishes the stream; read with a reader started after it committed everything
        # (a noida-db read_committed reader already fetching while a fence aborts misses later records).
        committed, ends = await topics.wait_for_commits(EOS_JOBS, timeout_s=120)
        got = await topics.read_answers(EOS_JOBS, timeout_s=60, settle_s=1.0, committed_only=True)
        workers[-1].signal(signal.SIGTERM)
        assert await workers[-1].wait() == 0, workers[-1].output()[-3000:]
    finally:
        for worker in workers:
            worker.close()
    everything = await read_topic(kafka.bootstrap, topics.replies, lambda rs: False, timeout_s=2.0)

    result = tally(f"exactly-once on {kafka.name}", got, sent, causal_reference)
    result.extra.update(plan=plan, records_in_log=len(everything), fenced_restarts=len(workers) - 1)
    logs = "\n".join(f"{w.args[-1]}:\n{w.output()[-2000:]}" for w in workers)
    message = result.report() + f"\n{logs}"
    assert result.clean and result.duplicated == 0, message
    # The crashes left aborted results in the log, hidden from read_committed: the kills did land
    # inside transactions.
    assert len(everything) > EOS_JOBS, message
    assert committed == ends, message
    by_id = {expected_id(s): s for s in sent}
    pooled = [r for r in got if by_id[r.id].job.return_pooled_hidden_states and by_id[r.id].job.items]
    assert pooled, "no job asked for pooled hidden states"
    for answer in pooled:  # the committed result carries them, as the reference computes them
        assert_matches_reference(answer, by_id[answer.id], causal_reference, atol=ATOL)
    await _assert_independent_readers_agree(kafka.bootstrap, topics.replies, got, sent, causal_reference)
