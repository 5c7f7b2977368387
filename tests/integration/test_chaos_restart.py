"""Chaos on a real broker: the broker killed and restarted empty under a running worker, while jobs
keep arriving (the rest of the chaos suite: test_chaos.py). Every job produced after the restart must be
answered with the reference's scores, and no commit sampled in the new log may pass an unanswered record.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import TopicAlreadyExistsError

from kafka_scorer.embedded.broker import EmbeddedBroker
from tests.integration.chaos import (
    CommitSampler,
    ReplyWatch,
    commit_violations,
    exited,
    tally,
    templated_jobs,
)
from tests.integration.jobs import Sent, expected_id, to_record
from tests.integration.kafka_helpers import (
    BrokerInfo,
    Topics,
    WorkerProcess,
    create_topics,
    decode_replies,
    produce,
    read_topic,
    unique,
)

pytestmark = pytest.mark.integration


OUTAGE_BEFORE, OUTAGE_AFTER, OUTAGE_PARTITIONS, OUTAGE_SEED = 150, 450, 3, 1204


async def _create_again(bootstrap: str, names: list[str], partitions: int) -> None:
    """The restarted memory broker has no topics; the worker's own retries may auto-create some first."""
    with contextlib.suppress(TopicAlreadyExistsError):
        await create_topics(bootstrap, names, partitions)


class RepliesGone(AssertionError):
    """Jobs unanswered in the reply log while the worker runs on: after its restart tansu can give a
    reply partition's first offsets out twice, and one of two acknowledged replies is gone (traced with
    a log of every send and its acknowledgement: each was acknowledged). Seen about 1 run in 25."""


async def test_a_broker_restart_mid_stream_loses_no_job_produced_after_it_and_commits_nothing_unanswered(
    causal_model, causal_scorer, causal_reference
) -> None:
    """The scenario below, once more on a fresh broker if the first run's broker lost acknowledged
    replies (`RepliesGone`): a second loss in a row fails."""
    try:
        await _restart_mid_stream(causal_model, causal_scorer, causal_reference)
    except RepliesGone:
        await _restart_mid_stream(causal_model, causal_scorer, causal_reference)


async def _restart_mid_stream(causal_model, causal_scorer, causal_reference) -> None:
    """tansu keeps its log in memory: a restart on the same port is an empty cluster at offset 0 while the
    worker still holds its old positions (what a topic deleted and recreated is on real Kafka). The
    worker must recover by itself or exit with one clear line, never hang silently; the jobs produced
    after the restart must all be answered, and no commit in the new log may pass an unanswered record."""
    before = templated_jobs(
        OUTAGE_BEFORE, OUTAGE_SEED, causal_scorer.describe().model_name, prefix="outage-a"
    )
    after = templated_jobs(
        OUTAGE_AFTER, OUTAGE_SEED + 1, causal_scorer.describe().model_name, prefix="outage-b"
    )
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
                await watch.wait_for(OUTAGE_BEFORE // 3, timeout_s=60, trouble=exited(workers[0]))
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
                        answered, "the jobs sent after the restart", 60, exited(workers[-1])
                    )
                except AssertionError as exc:
                    if workers[-1].proc.poll() is None:  # neither answering nor gone: stuck or skipping
                        # The live reader can miss acknowledged replies: right after its restart tansu
                        # sometimes gives a reply partition's first offsets out twice (the worker's
                        # retried sends and the topic's re-creation race), and the reader is already
                        # past them. What counts is the log as it stands: read it again from the start.
                        fresh = await read_topic(
                            info.bootstrap,
                            topics.replies,
                            lambda rs: _answered(rs, after) == len(after),
                            timeout_s=10,
                        )
                        got = _answered(fresh, after)
                        if got < len(after):
                            where = await _unanswered(info.bootstrap, topics, fresh, after)
                            raise RepliesGone(
                                f"{got} of {len(after)} jobs sent after the restart answered, and the "
                                f"worker is still running ({exc}); {where}\n"
                                f"{_log_without_batches(workers[-1].output())}"
                            ) from None
                    else:
                        exit_line = _one_clear_line(workers[-1])
                        workers.append(WorkerProcess(settings, "outage-restarted"))
                        await watch.wait_until(
                            answered, "the jobs sent after the restart", 60, exited(workers[-1])
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


async def _unanswered(bootstrap: str, topics: Topics, replies: list, sent: list[Sent]) -> str:
    """For a failure message: the unanswered jobs' request offsets, the partitions each topic has
    now, and where the `replies` read landed (a reply on a partition a reader does not read, or a
    request on a partition the worker was not given, looks like a lost job)."""
    answered = {r.id for r in decode_replies(replies)}
    missing = [divmod(i, OUTAGE_PARTITIONS) for i, s in enumerate(sent) if expected_id(s) not in answered]
    by_partition = {p: [offset for offset, q in missing if q == p] for p in sorted({q for _, q in missing})}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        counts = {
            t: sorted(consumer.partitions_for_topic(t) or ()) for t in (topics.requests, topics.replies)
        }
    finally:
        await consumer.stop()
    landed = Counter(r.partition for r in replies)
    return (
        f"unanswered (request partition: offsets) {by_partition}, partitions now {counts}, "
        f"replies seen by partition {dict(landed)}"
    )


def _one_clear_line(worker: WorkerProcess) -> str:
    """A worker that gave up must say why in one ERROR line, and exit non-zero."""
    assert worker.proc.returncode != 0, worker.output()[-3000:]
    errors = [line for line in worker.output().splitlines() if " ERROR " in line or " CRITICAL " in line]
    assert errors, f"the worker exited without an error line:\n{worker.output()[-3000:]}"
    return errors[-1]


def _log_without_batches(output: str, keep: int = 12000) -> str:
    """The worker's log for a failure message: its recovery lines, not the hundreds of batch reports
    around them (the last few of those say whether it was still scoring)."""
    lines = output.splitlines()
    batches = [line for line in lines if "batch_report" in line]
    others = [line for line in lines if "batch_report" not in line]
    return "\n".join([*others, f"... {len(batches)} batch reports, the last:", *batches[-3:]])[-keep:]
