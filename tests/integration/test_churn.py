"""Chaos on a real broker: three worker processes in one group under SIGKILL/SIGTERM churn, while a
stream keeps arriving. Every job must be answered with the reference's scores, and no commit sampled
along the way may pass a record that had no answer yet (the rest of the chaos suite: test_chaos.py).

Runs on the embedded broker and on Apache Kafka (`on_each_broker`), whose group coordinator is the
reference implementation's.

Faults are injected on events (a number of answers seen), with seeded choices, so a run on a loaded
machine sees the same faults in the same order, only later.
"""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tests.integration.brokers import on_each_broker
from tests.integration.chaos import CommitSampler, ReplyWatch, commit_violations, tally, templated_jobs
from tests.integration.jobs import expected_id, to_record
from tests.integration.kafka_helpers import (
    Topics,
    WorkerProcess,
    decode_replies,
    fresh_topics,
    gated,
    read_topic,
)

pytestmark = pytest.mark.integration


async def _produce_paced(bootstrap: str, records, chunk: int, pause_s: float) -> None:
    """Produce in chunks with a pause between them: a stream that keeps arriving while faults happen
    (the pause shapes the load; nothing waits on it)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for start in range(0, len(records), chunk):
            futures = [
                await producer.send(r.topic, r.value, key=r.key, headers=r.headers, partition=r.partition)
                for r in records[start : start + chunk]
            ]
            await asyncio.gather(*futures)
            await asyncio.sleep(pause_s)
    finally:
        await producer.stop()


def _lifecycle(worker: WorkerProcess) -> str:
    """The worker's log without its per-batch lines: signals, rebalances, drain, exit."""
    lines = worker.output().splitlines()
    return "\n".join(line for line in lines if "batch_report: batch " not in line)[-6000:]


CHURN_JOBS, CHURN_PARTITIONS, CHURN_SEED = 1500, 6, 1201
CHURN_FAULTS = ["kill", "kill", "kill", "kill", "term"]


class Crew:
    """Worker processes in one group; each slot restarts with a fresh process after a fault.

    The fresh process is a spare started before the fault: it loads its model while the crew serves, and
    its Kafka clients wait for a gate (fault_injection: SCORER_TEST_START_GATE) that the fault opens once
    its victim is gone. So a replacement joins the group about a second after the fault instead of after
    its own start-up, whose CPU the crew shared anyway; no spare outlives the faults."""

    def __init__(self, topics: Topics, model: Path, size: int, gates: Path, spares: int) -> None:
        self.topics, self.model, self.gates = topics, model, gates
        self.started: list[WorkerProcess] = []
        self.slots: list[WorkerProcess] = [self._start() for _ in range(size)]
        self.spares_left = spares
        self.spare = self._spare()

    def _start(self, gate: Path | None = None) -> WorkerProcess:
        name = f"churn-{len(self.started)}"
        # A small in-flight budget: each worker holds a few batches, not the stream, so a SIGTERM drains
        # in seconds and a SIGKILL throws away little (on a loaded 2-core machine the default 65,536
        # tokens queued 40 s of work per worker).
        settings = self.topics.settings(
            self.model, client_id=name, max_batch_tokens=64, max_inflight_tokens=1024
        )
        worker = WorkerProcess(settings, name=name, extra_env=gated(gate) if gate else None)
        self.started.append(worker)
        return worker

    def _spare(self) -> tuple[WorkerProcess, Path] | None:
        """The next replacement, loading now, held off Kafka by its gate (None once no fault is left)."""
        if not self.spares_left:
            return None
        self.spares_left -= 1
        gate = self.gates / f"gate-{len(self.started)}"
        return self._start(gate), gate

    def ready(self) -> list[int]:
        return [k for k, w in enumerate(self.slots) if w.proc.poll() is None and "worker ready" in w.output()]

    def trouble(self) -> str | None:
        if all(w.proc.poll() is not None for w in self.slots):
            return "every worker exited:\n" + "\n".join(w.output()[-1500:] for w in self.slots)
        return None

    async def fault(self, kind: str, rng: random.Random) -> str:
        while not self.ready():  # a victim that is serving, not one still loading its model
            assert self.trouble() is None, self.trouble()
            await asyncio.sleep(0.05)
        slot = rng.choice(self.ready())
        victim = self.slots[slot]
        if kind == "kill":
            victim.signal(signal.SIGKILL)
            assert await victim.wait() == -signal.SIGKILL
        else:
            victim.signal(signal.SIGTERM)
            try:
                rc = await victim.wait(timeout_s=90)
            except AssertionError:
                raise AssertionError(f"SIGTERM: no exit in 90 s; lifecycle:\n{_lifecycle(victim)}") from None
            assert rc == 0 and "worker stopped cleanly" in victim.output(), _lifecycle(victim)
        assert self.spare is not None, "more faults than spares"
        self.slots[slot], gate = self.spare
        gate.touch()
        self.spare = self._spare()
        return f"{kind} slot {slot}"

    async def stop(self) -> None:
        for worker in self.slots:  # a replacement still importing torch has no SIGTERM handler yet
            await worker.wait_for_log("worker ready", timeout_s=120)
        for worker in self.slots:
            worker.signal(signal.SIGTERM)
        for worker in self.slots:
            assert await worker.wait(timeout_s=90) == 0, _lifecycle(worker)

    def close(self) -> None:
        for worker in self.started:
            worker.close()


async def _stall_report(
    kafka, topics: Topics, watch: ReplyWatch, sent: list, id_by_key: dict, sampler: CommitSampler, crew: Crew
) -> str:
    """What a run whose answers stopped short needs to tell a lost record from a stalled group or a
    reader that missed a reply: the request records read back (a broker that lost one, or gave two one
    offset), any sampled commit that passed an unanswered record, a fresh read of the replies, where the
    unanswered jobs sit (records go round-robin over the partitions of a fresh topic), the last commits
    sampled, and each serving worker's lifecycle."""
    requests = await read_topic(
        kafka.bootstrap, topics.requests, lambda rs: len(rs) >= CHURN_JOBS, timeout_s=30
    )
    ahead = commit_violations(sampler.samples, requests, watch.records, lambda r: id_by_key[r.key])
    again = await read_topic(kafka.bootstrap, topics.replies, lambda rs: False, timeout_s=3.0)
    answered = {r.id for r in decode_replies(watch.records)}
    where = [
        f"{expected_id(s)} at partition {i % CHURN_PARTITIONS} offset {i // CHURN_PARTITIONS}"
        for i, s in enumerate(sent)
        if expected_id(s) not in answered
    ]
    last = sampler.samples[-1].offsets if sampler.samples else {}
    lives = "".join(f"\n--- slot {k}:\n{_lifecycle(w)[-2500:]}" for k, w in enumerate(crew.slots))
    return (
        f"requests read back: {len(requests)} ({len({(r.partition, r.offset) for r in requests})} offsets)\n"
        f"commits ahead of answers: {ahead[:5]}\n"
        f"replies read afresh: {len(again)} records, {len({r.id for r in decode_replies(again)})} ids\n"
        f"unanswered: {where[:10]}\nlast commits sampled: {last}{lives}"
    )


@on_each_broker()
async def test_three_workers_under_kill_churn_answer_every_job_and_never_commit_ahead(
    kafka, causal_model, causal_scorer, causal_reference, tmp_path
) -> None:
    topics = await fresh_topics(kafka, partitions=CHURN_PARTITIONS)
    sent = templated_jobs(CHURN_JOBS, CHURN_SEED, causal_scorer.describe().model_name, prefix="churn")
    records = [
        to_record(s, topics.requests, i % CHURN_PARTITIONS, with_content_type=i % 5 != 0)
        for i, s in enumerate(sent)
    ]
    id_by_key = {s.key: expected_id(s) for s in sent}
    rng = random.Random(CHURN_SEED)
    faults = rng.sample(CHURN_FAULTS, len(CHURN_FAULTS))
    thresholds = sorted(int(rng.uniform(0.05, 0.8) * CHURN_JOBS) for _ in faults)

    crew = Crew(topics, causal_model, 3, gates=tmp_path, spares=len(faults))
    done: list[str] = []
    try:
        async with (
            ReplyWatch(kafka.bootstrap, topics.replies) as watch,
            CommitSampler(kafka.bootstrap, topics.group, topics.requests, CHURN_PARTITIONS) as sampler,
        ):
            for k in range(len(crew.slots)):
                await crew.slots[k].wait_for_log("worker ready", timeout_s=120)
            producing = asyncio.create_task(_produce_paced(kafka.bootstrap, records, chunk=60, pause_s=0.4))
            for kind, threshold in zip(faults, thresholds, strict=True):
                await watch.wait_for(threshold, timeout_s=120, trouble=crew.trouble)
                done.append(f"{await crew.fault(kind, rng)} at {watch.distinct} answers")
            await producing
            try:
                await watch.wait_for(CHURN_JOBS, timeout_s=180, trouble=crew.trouble)
            except AssertionError as exc:
                report = await _stall_report(kafka, topics, watch, sent, id_by_key, sampler, crew)
                raise AssertionError(f"{exc}\nfaults: {done}\n{report}") from None
            committed, ends = await topics.wait_for_commits(CHURN_JOBS, timeout_s=60)
            await crew.stop()
        replies = await read_topic(kafka.bootstrap, topics.replies, lambda rs: False, timeout_s=2.0)
        requests = await read_topic(
            kafka.bootstrap, topics.requests, lambda rs: len(rs) >= CHURN_JOBS, timeout_s=30
        )
    finally:
        crew.close()

    result = tally("churn", decode_replies(replies), sent, causal_reference)
    violations = commit_violations(sampler.samples, requests, replies, lambda r: id_by_key[r.key])
    result.extra.update(
        workers_started=len(crew.started),
        commit_samples=len(sampler.samples),
        commits_checked=sum(len(s.offsets) for s in sampler.samples),
        commit_violations=len(violations),
    )
    message = result.report() + f"\nfaults: {done}" + "".join(f"\n  {v}" for v in violations[:10])
    assert result.clean, message
    assert not violations, message
    assert committed == ends, message
    assert len(done) == len(CHURN_FAULTS)
