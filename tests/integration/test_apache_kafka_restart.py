"""A running worker through restarts of a real Apache Kafka broker (issue 39 items 3 and 4).

- Restarted keeping its log (the normal case): every job is answered, and only jobs in flight at the
  restart (at or past the group's committed offset then) may be answered twice. The worker repositions
  each partition whose leader connection was replaced (`kafka/log_reset.py`): on a kept log that reads
  the jobs in flight once more, never skips one.
- Restarted with its log directory deleted (a broker whose disk was replaced): every job the new broker
  acknowledged is answered, while a backlog the worker fetched from the old broker is still in flight.

Each scenario runs `RUNS` times on one broker (a fault test that passes by luck must not pass here).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator

import pytest
from aiokafka.errors import TopicAlreadyExistsError

from tests.integration.jobs import assert_answers, expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import (
    BrokerInfo,
    InProcessWorker,
    committed_offsets,
    create_topics,
    decode_replies,
    fresh_topics,
    hold_device,
    produce,
    read_topic,
)

pytestmark = [pytest.mark.integration, pytest.mark.apache_kafka]

PARTITIONS, BEFORE, AFTER, RUNS = 3, 90, 60, 2


@pytest.fixture(scope="module")
def apache_kafka(apache_kafka_distribution) -> Iterator[object]:
    """A broker of this module's own: the tests stop and wipe it, which no other test may see.
    `apache_kafka_distribution` (tests/conftest.py) skips, or fails where CI requires the broker.

    Restarted from a worker thread (the event loop keeps serving the worker meanwhile), so it must not
    die with its parent: Linux sends the parent-death signal when the *thread* that started the JVM
    ends, and a restarted broker vanished under the next test. `close()` stops it all the same."""
    from devtools.apache_kafka import ApacheKafka

    with ApacheKafka(apache_kafka_distribution, die_with_parent=False) as broker:
        yield broker


def _info(broker) -> BrokerInfo:
    return BrokerInfo(broker.bootstrap_servers, "apache-kafka", transactions=True, min_session_timeout_ms=0)


async def _restart_under_a_worker(broker, empty: bool, run: int, model, scorer, reference, monkeypatch):
    info = _info(broker)
    topics = await fresh_topics(info, partitions=PARTITIONS)
    name = scorer.describe().model_name
    before = mixed_jobs(BEFORE, seed=60 + run, model_name=name, prefix=f"before{run}")
    after = mixed_jobs(AFTER, seed=80 + run, model_name=name, prefix=f"after{run}")
    settings = topics.settings(model, max_batch_tokens=64, rebalance_grace_s=3.0)
    device = hold_device(monkeypatch, scorer)  # cleared: the backlog is in flight at the restart
    async with InProcessWorker(settings, scorer.engine) as worker:
        await produce(
            info.bootstrap,
            [to_record(s, topics.requests, i % PARTITIONS, True) for i, s in enumerate(before)],
        )
        await topics.read_answers(BEFORE // 4, timeout_s=60)
        device.clear()
        await asyncio.sleep(1.0)  # answers already computed are acknowledged and committed meanwhile
        at_restart = await committed_offsets(info.bootstrap, topics.group, topics.requests, PARTITIONS)
        await asyncio.to_thread(broker.restart, empty)
        if empty:
            with contextlib.suppress(TopicAlreadyExistsError):
                await create_topics(info.bootstrap, [topics.requests, topics.replies], PARTITIONS)
        device.set()
        await produce(
            info.bootstrap, [to_record(s, topics.requests, i % PARTITIONS, True) for i, s in enumerate(after)]
        )
        sent = after if empty else [*before, *after]
        want = {expected_id(s) for s in sent}
        records = await read_topic(
            info.bootstrap,
            topics.replies,
            lambda rs: want <= {r.id for r in decode_replies(rs)},
            timeout_s=90,
        )
        await asyncio.sleep(1.0)  # late duplicates, if any, land meanwhile
        records = await read_topic(info.bootstrap, topics.replies, lambda rs: False, timeout_s=1.0)
        assert worker.running
        assert await worker.stop() == 0
    answers = [r for r in decode_replies(records) if r.id in want]
    lost = want - {r.id for r in answers}
    assert not lost, f"{len(lost)} of {len(want)} acknowledged jobs never answered: {sorted(lost)[:8]}"
    assert_answers(answers, sent, reference, once=False)
    if not empty:  # only jobs in flight at the restart (past the committed offset then) twice
        offsets = {expected_id(s): (i % PARTITIONS, i // PARTITIONS) for i, s in enumerate(before)}
        twice = [job for job, n in Counter(r.id for r in answers).items() if n > 1]
        settled = [j for j in twice if j in offsets and offsets[j][1] < (at_restart[offsets[j][0]] or 0)]
        where = sorted(offsets[j] for j in settled)
        assert not settled, (
            f"jobs committed before the restart answered again: {where[:12]} (committed then: {at_restart})"
        )


@pytest.mark.parametrize("empty", [False, True], ids=["log-kept", "log-deleted"])
async def test_a_worker_loses_no_job_through_a_broker_restart(
    apache_kafka, empty, causal_model, causal_scorer, causal_reference, monkeypatch
) -> None:
    for run in range(RUNS):
        await _restart_under_a_worker(
            apache_kafka, empty, run, causal_model, causal_scorer, causal_reference, monkeypatch
        )
