"""A few CPU threads that prepare jobs and hand each back to the event loop as it ends.

Why not `ThreadPoolExecutor` + `asyncio.wrap_future`: per job that costs a concurrent Future (a lock and a
condition), a work item, a semaphore check, an asyncio Future chained to it and one cross-thread wake-up
of the loop (a write to its self-pipe): ~18 µs of the event loop's time and ~28 µs of wall time per job,
measured with a no-op prepare, where a job's whole path through the loop is a few hundred. That loop
time is taken from the device thread, which needs the GIL to launch its kernels. Here a job is one
queue put; finished prepares collect in a deque, and the loop is woken once for all that finished
meanwhile (below 1 µs per job, same measure).

What is kept from the executor: each job is its own task on one of `threads` threads, so a record that
takes seconds to tokenize holds one thread and delays nobody else's job; a job's callback runs on the
loop as soon as its own prepare ends; closing drops what has not started.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Done = Callable[[Any, BaseException | None], None]
"""Called on the event loop with (value, None) or (None, the exception the prepare raised)."""


@dataclass(eq=False, slots=True)
class _Task:
    run: Callable[[], Any]
    done: Done
    round: PrepareRound


class PrepareRound:
    """The prepares of one poll, so the next fetch can wait for them (for at most a timeout)."""

    def __init__(self, pool: PreparePool) -> None:
        self._pool = pool
        self._pending = 0
        self._finished: asyncio.Future[None] | None = None

    def submit(self, run: Callable[[], Any], done: Done) -> None:
        self._pending += 1
        self._pool.put(_Task(run, done, self))

    async def wait(self, timeout_s: float) -> None:
        """Until every prepare of this round has ended (and its `done` ran), or `timeout_s`."""
        if self._pending:
            self._finished = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._finished], timeout=timeout_s)

    def _one_done(self) -> None:
        self._pending -= 1
        if not self._pending and self._finished is not None and not self._finished.done():
            self._finished.set_result(None)


class PreparePool:
    def __init__(self, threads: int, name: str) -> None:
        self._threads = threads
        self._name = name
        self._todo: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._ended: collections.deque[tuple[_Task, Any, BaseException | None]] = collections.deque()
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def round(self) -> PrepareRound:
        return PrepareRound(self)

    def put(self, task: _Task) -> None:
        if self._closed:
            return  # closing drops what has not started, as it drops what is queued
        if self._loop is None:  # threads start with the first job: an idle worker holds none
            self._loop = asyncio.get_running_loop()
            for i in range(self._threads):
                threading.Thread(target=self._serve, name=f"{self._name}_{i}", daemon=True).start()
        self._todo.put(task)

    def close(self) -> None:
        """Drop every prepare not yet started; running ones end, but their `done` is not called."""
        self._closed = True
        try:
            while True:
                self._todo.get_nowait()
        except queue.Empty:
            pass
        for _ in range(self._threads if self._loop is not None else 0):
            self._todo.put(None)

    # ---- on a prepare thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        while (task := self._todo.get()) is not None:
            ended: tuple[_Task, Any, BaseException | None]
            try:
                ended = (task, task.run(), None)
            except BaseException as exc:  # handed to the job's `done`, like a future's exception
                ended = (task, None, exc)
            self._ended.append(ended)
            # one wake-up for all that end before the loop drains: `_drain` clears the flag before it
            # reads the deque, so an append it might miss always schedules a drain of its own
            if not self._wake_pending:
                self._wake_pending = True
                try:
                    self._loop.call_soon_threadsafe(self._drain)  # type: ignore[union-attr]  # set before any thread starts
                except RuntimeError:  # the loop is closed: nobody is left to answer
                    return

    # ---- on the event loop -----------------------------------------------------------------------

    def _drain(self) -> None:
        self._wake_pending = False
        while self._ended:
            task, value, exc = self._ended.popleft()
            if self._closed:
                continue
            try:
                task.done(value, exc)
            except Exception:  # a callback's bug must not keep the jobs after it from their answers
                log.exception("a prepare's completion failed")
            task.round._one_done()
