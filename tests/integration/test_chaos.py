"""Chaos on a real broker: workers killed and restarted, hostile records, a flood, a broker restart (and
exactly-once under repeated kills, in test_exactly_once.py). Each scenario is bounded in time, prints its
tally (jobs / answered / lost / duplicated / wrong) and fails on any job lost or scored wrong.

Faults are injected on events (a number of answers seen, a log line), with seeded choices, so a run on
a loaded machine sees the same faults in the same order, only later.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAlreadyExistsError

from kafka_scorer.embedded.broker import EmbeddedBroker, free_port
from kafka_scorer.wire.protocol import Job, Result
from tests.integration.chaos import (
    Background,
    CommitSample,
    CommitSampler,
    ReplyWatch,
    Tally,
    commit_violations,
    gauge,
    get_text,
    rss_bytes,
    tally,
    templated_jobs,
)
from tests.integration.hostile import Hostile, hostile_records
from tests.integration.jobs import Sent, expected_id, max_abs_diff, to_record
from tests.integration.kafka_helpers import (
    BrokerInfo,
    Out,
    Topics,
    WorkerProcess,
    create_topics,
    decode_replies,
    fresh_topics,
    gated,
    produce,
    read_topic,
    unique,
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


def _exited(worker: WorkerProcess) -> Callable[[], str | None]:
    """A `trouble` check for ReplyWatch: the worker process has ended (with its log)."""

    def trouble() -> str | None:
        if worker.proc.poll() is None:
            return None
        return f"the worker exited (rc={worker.proc.returncode}):\n{worker.output()[-4000:]}"

    return trouble


def _lifecycle(worker: WorkerProcess) -> str:
    """The worker's log without its per-batch lines: signals, rebalances, drain, exit."""
    return "\n".join(line for line in worker.output().splitlines() if "service: batch " not in line)[-6000:]


# ---- three workers under SIGKILL churn ------------------------------------------------------------

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


async def test_three_workers_under_kill_churn_answer_every_job_and_never_commit_ahead(
    kafka, causal_model, causal_scorer, causal_reference, tmp_path
) -> None:
    topics = await fresh_topics(kafka, partitions=CHURN_PARTITIONS)
    sent = templated_jobs(CHURN_JOBS, CHURN_SEED, causal_scorer.model_name, prefix="churn")
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
            await watch.wait_for(CHURN_JOBS, timeout_s=180, trouble=crew.trouble)
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


# ---- a poison mix ---------------------------------------------------------------------------------

POISON_HOSTILE, POISON_VALID, POISON_SEED = 150, 150, 1202


def _code(result: Result) -> str | None:
    return result.error.code.value if result.error is not None else None


def _judge_hostile(hostile: Hostile, answers: list, dead: dict[bytes, object], reference) -> str | None:
    expect, record = hostile.expect, hostile.record
    if not answers:
        return None  # counted as lost
    _, result = answers[0]
    code = _code(result)
    where = f"{expect.kind} ({hostile.match[:40]!r})"
    if code not in expect.codes:
        message = result.error.message[:160] if result.error else "scored"
        return f"{where}: answered {code} ({message}), expected one of {sorted(map(str, expect.codes))}"
    if expect.job_id is not None and result.id != expect.job_id:
        return f"{where}: answered with id {result.id[:60]!r}, expected {expect.job_id!r}"
    if expect.job is not None:
        diff = max_abs_diff(result.scores, reference.scores(expect.job))
        if diff > 1e-4:
            return f"{where}: scores off the reference by {diff:.2e}"
    if expect.warned and not result.warnings:
        return f"{where}: no warning about the unusable reply_topic header"
    due = expect.dead_letter if expect.dead_letter is not None else code == "invalid_message"
    copy = dead.get(record.key)
    if due and copy is None:
        return f"{where}: answered {code} but no dead-letter copy"
    if not due and copy is not None:
        return f"{where}: answered {code} and dead-lettered, the contract says no copy"
    if copy is not None and (
        copy.value != record.value or list(copy.headers)[: len(record.headers)] != record.headers
    ):
        return f"{where}: the dead-letter copy is not the record untouched"
    return None


async def test_a_poison_mix_is_answered_as_the_contract_says_and_never_restarts_the_worker(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    topics = await fresh_topics(kafka, partitions=2, dead_letters=True)
    hostile = hostile_records(POISON_HOSTILE, POISON_SEED, topics.requests)
    valid = templated_jobs(POISON_VALID, POISON_SEED, causal_scorer.model_name, prefix="poison-valid")
    rng = random.Random(POISON_SEED)
    order = [("hostile", h) for h in hostile] + [("valid", s) for s in valid]
    rng.shuffle(order)
    records = []
    for i, (what, item) in enumerate(order):
        record = item.record if what == "hostile" else to_record(item, topics.requests, None, i % 3 != 0)
        record.partition = i % 2
        records.append(record)
    total = len(records)

    settings = topics.settings(causal_model, client_id="poison", max_batch_tokens=256)
    async with (
        WorkerProcess(settings, "poison") as worker,
        ReplyWatch(kafka.bootstrap, topics.replies) as watch,
    ):
        await produce(kafka.bootstrap, records, max_request_size=4 << 20)
        await watch.wait_until(lambda: len(watch.records) >= total, f"{total} answers", 120, _exited(worker))
        dead = await read_topic(kafka.bootstrap, topics.dead_letters, lambda rs: False, timeout_s=2.0)
        committed, ends = await topics.wait_for_commits(total, timeout_s=30)
        alive = worker.proc.poll() is None
        worker.signal(signal.SIGTERM)
        rc = await worker.wait()
    replies = await read_topic(kafka.bootstrap, topics.replies, lambda rs: False, timeout_s=1.0)
    log = worker.output()

    answers: dict[bytes, list] = {}
    for reply, result in zip(replies, decode_replies(replies), strict=True):
        answers.setdefault(reply.key, []).append((reply, result))
    dead_by_key = {d.key: d for d in dead}
    problems = [
        p
        for h in hostile
        if (p := _judge_hostile(h, answers.get(h.match, []), dead_by_key, causal_reference))
    ]
    scored = tally(
        "poison (valid jobs)", [r for s in valid for _, r in answers.get(s.key, [])], valid, causal_reference
    )
    lost = [h.expect.kind for h in hostile if h.match not in answers]
    result = Tally(
        name="poison",
        jobs=total,
        answered=total - len(lost) - scored.lost,
        lost=len(lost) + scored.lost,
        duplicated=sum(len(a) - 1 for a in answers.values()),
        wrong=len(problems) + scored.wrong,
        problems=[f"lost: {lost[:10]}"] * bool(lost) + problems + scored.problems,
        extra={
            "hostile": len(hostile),
            "dead_lettered": len(dead),
            "kinds": len({h.expect.kind.split(" (")[0] for h in hostile}),
        },
    )
    outcomes = Counter(
        (
            h.expect.kind.split(" (")[0].split(":")[0],
            _code(answers[h.match][0][1]) if h.match in answers else "lost",
        )
        for h in hostile
    )
    print("poison outcomes:", ", ".join(f"{k}: {c} x{n}" for (k, c), n in sorted(outcomes.items())))
    message = result.report() + f"\noutcomes: {dict(outcomes)}\nworker log:\n{log[-3000:]}"
    assert alive, message
    assert "fatal" not in log.lower(), message
    assert log.count("worker ready") == 1, message
    assert result.clean and result.duplicated == 0, message
    assert len(dead) == len(dead_by_key), message  # one copy per dead-lettered record
    assert rc == 0 and committed == ends, message


# ---- a flood faster than the model ------------------------------------------------------------------

FLOOD_JOBS, FLOOD_PARTITIONS, FLOOD_SEED = 5000, 3, 1203
FLOOD_POLL = 50  # max_poll_records: the worker holds at most 4 polls' worth of records
WARM_JOBS = 300
RSS_MARGIN = 128 << 20


class WorkerGauges(Background):
    """The worker's RSS (from /proc) and its in-flight and paused gauges (from /metrics), every 50 ms."""

    def __init__(self, pid: int, metrics_port: int) -> None:
        self.pid, self.url = pid, f"http://127.0.0.1:{metrics_port}/metrics"
        self.rss: list[int] = []
        self.inflight_jobs: list[float] = []
        self.paused: list[float] = []

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError):  # the process is going away: nothing more to sample
                self.rss.append(rss_bytes(self.pid))
                text = await asyncio.to_thread(get_text, self.url)
                self.inflight_jobs.append(gauge(text, "kafka_scorer_inflight_jobs"))
                self.paused.append(gauge(text, "kafka_scorer_paused_partitions"))
            await asyncio.sleep(0.05)


def _flood(n: int, seed: int, topic: str) -> tuple[list[Sent], list[Out]]:
    """Tiny jobs (a few tokens each, a handful of distinct bodies so the reference runs once each)."""
    rng = random.Random(seed)
    shapes = [
        Job(
            query=[rng.randrange(4, 380) for _ in range(3)],
            items=[[rng.randrange(4, 380) for _ in range(2)]],
            label_token_ids=[3, 77],
        )
        for _ in range(8)
    ]
    sent = [
        Sent(
            msgspec.structs.replace(rng.choice(shapes), id=f"flood-{i}"),
            "msgpack",
            f"flood-{i}".encode(),
            None,
        )
        for i in range(n)
    ]
    return sent, [to_record(s, topic, i % FLOOD_PARTITIONS, True) for i, s in enumerate(sent)]


async def test_a_flood_faster_than_the_model_is_answered_with_bounded_memory(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    topics = await fresh_topics(kafka, partitions=FLOOD_PARTITIONS)
    sent, records = _flood(WARM_JOBS + FLOOD_JOBS, FLOOD_SEED, topics.requests)
    port = free_port()
    settings = topics.settings(
        causal_model, client_id="flood", max_batch_tokens=1024, max_poll_records=FLOOD_POLL, metrics_port=port
    )
    async with (
        WorkerProcess(settings, "flood") as worker,
        ReplyWatch(kafka.bootstrap, topics.replies) as watch,
        WorkerGauges(worker.proc.pid, port) as gauges,
    ):
        # Warm-up: the model has run full batches, the allocator has its working set.
        await produce(kafka.bootstrap, records[:WARM_JOBS])
        await watch.wait_for(WARM_JOBS, timeout_s=60, trouble=_exited(worker))
        warm, flood_from = max(gauges.rss), len(gauges.rss)
        await produce(kafka.bootstrap, records[WARM_JOBS:])
        await watch.wait_for(len(sent), timeout_s=150, trouble=_exited(worker))
        committed, ends = await topics.wait_for_commits(len(sent), timeout_s=30)
        metrics = await asyncio.to_thread(get_text, gauges.url)
        pauses = gauge(metrics, "kafka_scorer_backpressure_pauses_total")
        worker.signal(signal.SIGTERM)
        assert await worker.wait() == 0, worker.output()[-3000:]
    replies = await read_topic(kafka.bootstrap, topics.replies, lambda rs: False, timeout_s=1.0)

    peak = max(gauges.rss[flood_from:])
    result = tally("flood", decode_replies(replies), sent, causal_reference)
    result.extra.update(
        rss_warm_mib=warm >> 20,
        rss_peak_mib=peak >> 20,
        peak_inflight_jobs=int(max(gauges.inflight_jobs)),
        pauses=int(pauses),
        paused_samples=sum(1 for p in gauges.paused if p),
    )
    message = result.report()
    assert result.clean, message
    # Faster than the model: backpressure paused fetching, and held the records in flight to its cap
    # (4 polls' worth, plus the poll that crossed it) while thousands waited in the topic.
    assert pauses >= 1, message
    assert max(gauges.inflight_jobs) <= 5 * FLOOD_POLL, message
    # Memory: after warm-up a bounded worker moves within allocator churn and fetch buffers (+15 to
    # +90 MiB measured here, depending on record sizes; +60 MiB over a 50,000-job flood in issue 12).
    # A worker that leaked or buffered in proportion to the flood would pass the margin long before
    # the flood is over: it is the bound on what a run of any length may add.
    assert peak - warm <= RSS_MARGIN, message
    assert committed == ends, message


# ---- the broker killed and restarted ------------------------------------------------------------------

OUTAGE_BEFORE, OUTAGE_AFTER, OUTAGE_PARTITIONS, OUTAGE_SEED = 150, 450, 3, 1204


async def _create_again(bootstrap: str, names: list[str], partitions: int) -> None:
    """The restarted memory broker has no topics; the worker's own retries may auto-create some first."""
    with contextlib.suppress(TopicAlreadyExistsError):
        await create_topics(bootstrap, names, partitions)


async def test_a_broker_restart_mid_stream_loses_no_job_produced_after_it_and_commits_nothing_unanswered(
    causal_model, causal_scorer, causal_reference
) -> None:
    """tansu keeps its log in memory: a restart on the same port is an empty cluster at offset 0 while the
    worker still holds its old positions (what a topic deleted and recreated is on real Kafka). The
    worker must recover by itself or exit with one clear line, never hang silently; the jobs produced
    after the restart must all be answered, and no commit in the new log may pass an unanswered record."""
    before = templated_jobs(OUTAGE_BEFORE, OUTAGE_SEED, causal_scorer.model_name, prefix="outage-a")
    after = templated_jobs(OUTAGE_AFTER, OUTAGE_SEED + 1, causal_scorer.model_name, prefix="outage-b")
    broker = EmbeddedBroker().start()
    info = BrokerInfo(
        broker.bootstrap_servers, "tansu (private)", transactions=False, min_session_timeout_ms=0
    )
    topics = Topics(info, unique("req"), unique("res"), unique("group"), OUTAGE_PARTITIONS)
    names = [topics.requests, topics.replies]
    workers: list[WorkerProcess] = []
    try:
        await create_topics(info.bootstrap, names, OUTAGE_PARTITIONS)
        settings = topics.settings(causal_model, client_id="outage", max_batch_tokens=64)
        workers.append(WorkerProcess(settings, "outage"))
        await workers[0].wait_for_log("worker ready", timeout_s=120)
        async with CommitSampler(
            info.bootstrap, topics.group, topics.requests, OUTAGE_PARTITIONS + 1
        ) as sampler:
            async with ReplyWatch(info.bootstrap, topics.replies) as watch:
                await produce(
                    info.bootstrap, [to_record(s, topics.requests, i % 3, True) for i, s in enumerate(before)]
                )
                await watch.wait_for(OUTAGE_BEFORE // 3, timeout_s=60, trouble=_exited(workers[0]))
                answered_before = watch.distinct
            # Mid-stream: most of the first jobs are still unanswered. A short grace, as elsewhere: tansu
            # waits for its clients to hang up before it honours SIGTERM (5 s, then the SIGKILL anyway).
            broker.stop(timeout_s=0.2)
            broker = EmbeddedBroker(port=broker.port).start()
            restarted_ms = int(time.time() * 1000)
            await _create_again(info.bootstrap, names, OUTAGE_PARTITIONS)
            records = [to_record(s, topics.requests, i % 3, True) for i, s in enumerate(after)]
            await produce(info.bootstrap, records)
            async with ReplyWatch(info.bootstrap, topics.replies) as watch:

                def answered() -> bool:
                    return _answered(watch.records, after) == len(after)

                exit_line = None
                try:
                    await watch.wait_until(
                        answered, "the jobs sent after the restart", 60, _exited(workers[-1])
                    )
                except AssertionError as exc:
                    if workers[-1].proc.poll() is None:  # neither answering nor gone: stuck or skipping
                        got = _answered(watch.records, after)
                        raise AssertionError(
                            f"{got} of {len(after)} jobs sent after the restart answered, and the worker "
                            f"is still running ({exc})\n{workers[-1].output()[-3000:]}"
                        ) from None
                    exit_line = _one_clear_line(workers[-1])
                    workers.append(WorkerProcess(settings, "outage-restarted"))
                    await watch.wait_until(
                        answered, "the jobs sent after the restart", 60, _exited(workers[-1])
                    )
                committed, ends = await topics.wait_for_commits(OUTAGE_AFTER, timeout_s=30)
            for worker in workers:
                if worker.proc.poll() is None:
                    worker.signal(signal.SIGTERM)
                    assert await worker.wait() == 0, worker.output()[-3000:]
        requests = await read_topic(info.bootstrap, topics.requests, lambda rs: len(rs) >= OUTAGE_AFTER, 30)
        replies = await read_topic(info.bootstrap, topics.replies, lambda rs: False, timeout_s=1.0)
    finally:
        for worker in workers:
            worker.close()
        broker.stop(timeout_s=0.2)

    ids = {expected_id(s) for s in after}
    mine = [r for r in decode_replies(replies) if r.id in ids]  # the first jobs' late answers may land too
    result = tally("broker restart (jobs sent after it)", mine, after, causal_reference)
    id_by_key = {s.key: expected_id(s) for s in after}
    violations = commit_violations(sampler.since(restarted_ms), requests, replies, lambda r: id_by_key[r.key])
    result.extra.update(
        answered_before_kill=answered_before,
        worker_exited=exit_line or "no, recovered",
        commit_samples=len(sampler.since(restarted_ms)),
        commit_violations=len(violations),
    )
    logs = "\n".join(f"{w.args[-1]} log:\n{w.output()[-3000:]}" for w in workers)
    message = result.report() + "".join(f"\n  {v}" for v in violations[:10]) + f"\n{logs}"
    assert result.clean, message
    assert not violations, message
    assert sampler.since(restarted_ms), "no commit sampled after the restart: the check saw nothing"
    assert committed == ends, message


def _answered(records: list, sent: list[Sent]) -> int:
    ids = {expected_id(s) for s in sent}
    return len({r.id for r in decode_replies(records)} & ids)


def _one_clear_line(worker: WorkerProcess) -> str:
    """A worker that gave up must say why in one ERROR line, and exit non-zero."""
    assert worker.proc.returncode != 0, worker.output()[-3000:]
    errors = [line for line in worker.output().splitlines() if " ERROR " in line or " CRITICAL " in line]
    assert errors, f"the worker exited without an error line:\n{worker.output()[-3000:]}"
    return errors[-1]


# ---- the checks' own guards -----------------------------------------------------------------------


def test_the_commit_check_catches_a_commit_ahead_of_its_answers() -> None:
    """Guard for the check the churn and outage tests rely on: it must see a commit that passed a record
    before its answer was written, and one beyond the log's end; and pass a commit that trails."""
    from types import SimpleNamespace

    from kafka_scorer.wire.protocol import Result, encode_result

    def request(offset: int) -> SimpleNamespace:
        return SimpleNamespace(partition=0, offset=offset, key=f"k{offset}".encode())

    def reply(offset: int, at_ms: int) -> SimpleNamespace:
        value = encode_result(Result(id=f"k{offset}", scores=[]))
        return SimpleNamespace(value=value, headers=[("content-type", b"application/json")], timestamp=at_ms)

    requests = [request(o) for o in range(3)]
    replies = [reply(0, 100), reply(2, 110), reply(1, 300), reply(1, 120)]  # 1 answered twice, first at 120

    def check(at_ms: int, committed: int) -> list[str]:
        samples = [CommitSample(at_ms, {0: committed})]
        return commit_violations(samples, requests, replies, lambda r: r.key.decode())

    assert check(at_ms=130, committed=3) == []
    assert check(at_ms=105, committed=1) == []
    assert check(at_ms=115, committed=3) != []  # offset 1 was answered only at 120
    assert check(at_ms=500, committed=4) != []  # beyond the end
    assert (
        commit_violations([CommitSample(500, {0: 2})], requests, replies[:2], lambda r: r.key.decode()) != []
    )  # offset 1 never answered
