"""No broker at all: the worker keeps retrying and says so, stays up, and a stop request still ends it
cleanly. A real aiokafka client against a loopback port where nothing listens, not a mock."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kafka_scorer.config import Settings
from kafka_scorer.embedded.broker import free_port
from kafka_scorer.worker.service import Worker
from tests.worker.conftest import FakeEngine


async def test_unreachable_broker_is_retried_and_logged_until_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        model="unused",
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        metrics_port=0,
        request_topics=["jobs"],
    )
    worker = Worker(settings, FakeEngine())  # with no broker no job ever arrives
    stop = asyncio.Event()
    caplog.set_level(logging.WARNING, logger="kafka_scorer")
    task = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(1.5)
    assert not task.done(), "the worker must not give up while the broker is away"
    assert not worker.ready
    retries = [r for r in caplog.records if "unreachable" in r.getMessage() and "retrying" in r.getMessage()]
    assert len(retries) >= 2, [r.getMessage() for r in caplog.records]
    stop.set()
    assert await asyncio.wait_for(task, 10) == 0
