"""Producers that keep sending jobs through a broker's outage, remembering which the broker acknowledged
and when: after a restart, the jobs a test must see answered are those the new broker acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from tests.integration.jobs import Sent, expected_id, mixed_jobs, to_record


@dataclass
class Feeder:
    """Sends `jobs` round-robin over `partitions` of `topic`, one every `every_s`, each send on its own
    (a send refused during the outage does not hold up the next); `acked` maps each acknowledged job id
    to when its acknowledgement came (monotonic seconds)."""

    bootstrap: str
    topic: str
    partitions: int
    jobs: list[Sent]
    every_s: float = 0.02
    request_timeout_ms: int = 4_000
    acked: dict[str, float] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _run: asyncio.Task[None] | None = None
    _stopped: bool = False

    async def __aenter__(self) -> Feeder:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            request_timeout_ms=self.request_timeout_ms,
            metadata_max_age_ms=1_000,
        )
        await self._producer.start()
        self._run = asyncio.create_task(self._feed())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop sending; wait for the sends in flight to be acknowledged or refused."""
        if self._run is not None:
            self._run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._run
            self._run = None
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.request_timeout_ms / 1000 + 5)
        if not self._stopped:
            self._stopped = True
            await self._producer.stop()

    @property
    def done(self) -> bool:
        return self._run is not None and self._run.done()

    def acked_since(self, since: float) -> list[Sent]:
        return [s for s in self.jobs if self.acked.get(expected_id(s), -1.0) > since]

    async def _feed(self) -> None:
        for i, sent in enumerate(self.jobs):
            task = asyncio.create_task(self._send(sent, i % self.partitions))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(self.every_s)

    async def _send(self, sent: Sent, partition: int) -> None:
        r = to_record(sent, self.topic, partition, True)
        with contextlib.suppress(KafkaError, asyncio.TimeoutError):
            await self._producer.send_and_wait(
                r.topic, r.value, key=r.key, headers=r.headers, partition=r.partition
            )
            self.acked[expected_id(sent)] = time.monotonic()


def endless_jobs(model_name: str, prefix: str, n: int = 20_000) -> list[Sent]:
    """More jobs than any scenario sends: the feeder is stopped, not run dry."""
    return mixed_jobs(n, seed=7, model_name=model_name, prefix=prefix)
