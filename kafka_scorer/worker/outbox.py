"""Answered tickets on their way to delivery: each handful on a task of its own, so the event loop goes
on fetching while the broker acknowledges; a failure there is the worker's end, never a lost answer.

Errors found while preparing (an invalid job, a too-long item) finish one by one on the prepare threads;
they are gathered for the rest of the loop turn and sent together, which in exactly-once mode is one
transaction for all of them instead of one each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from kafka_scorer.worker.delivery import Delivery
from kafka_scorer.worker.ticket import Ticket

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self) -> None:
        self.delivery: Delivery | None = None  # set once the producer has started (its mode decides)
        self.failure: BaseException | None = None  # what stopped a delivery: the worker must stop
        self.closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._gathered: list[Ticket[Any]] = []

    def send(self, tickets: Sequence[Ticket[Any]]) -> None:
        """Deliver answered tickets (each with its `result`) on a task of their own."""
        if not tickets or self.closing:
            return
        assert self.delivery is not None, "answers before the producer started"
        task = asyncio.create_task(self._deliver(self.delivery, list(tickets)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def send_soon(self, ticket: Ticket[Any]) -> None:
        """Deliver with the others answered in this loop turn."""
        if not self._gathered:
            asyncio.get_running_loop().call_soon(self._flush)
        self._gathered.append(ticket)

    def _flush(self) -> None:
        tickets, self._gathered = self._gathered, []
        self.send(tickets)

    async def _deliver(self, delivery: Delivery, tickets: list[Ticket[Any]]) -> None:
        try:
            await delivery.deliver(tickets)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # catch-all, on purpose: a fenced producer or a bug must stop the
            # worker (its tickets stay unanswered and uncommitted) rather than hang with unsettled work
            log.exception("delivery failed")
            self.failure = self.failure or exc

    async def close(self) -> None:
        """Cancel what is still being delivered (after the drain: nothing more is committed)."""
        self.closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
