"""The prepare pool: each job on its own thread task, its completion on the event loop as soon as it ends."""

from __future__ import annotations

import asyncio
import threading
import time

from kafka_scorer.worker.prepare_pool import PreparePool


def _recorder(loop_thread: int, seen: list) -> object:
    def done(value, exc) -> None:
        assert threading.get_ident() == loop_thread  # completions run on the event loop
        seen.append(value if exc is None else repr(exc))

    return done


async def test_every_job_is_answered_on_the_loop_with_its_value_or_its_exception() -> None:
    pool, seen = PreparePool(3, "t"), []
    done = _recorder(threading.get_ident(), seen)

    def boom() -> None:
        raise ValueError("bad job")

    preparing = pool.round()
    for i in range(500):
        preparing.submit(lambda i=i: i * i, done)
    preparing.submit(boom, done)
    await preparing.wait(10)
    assert sorted(v for v in seen if isinstance(v, int)) == [i * i for i in range(500)]
    assert "ValueError('bad job')" in seen and len(seen) == 501
    pool.close()


async def test_a_slow_prepare_holds_one_thread_and_no_other_job() -> None:
    pool, seen, gate = PreparePool(2, "t"), [], threading.Event()
    done = _recorder(threading.get_ident(), seen)
    preparing = pool.round()
    preparing.submit(lambda: gate.wait(10) and "slow", done)
    for i in range(20):
        preparing.submit(lambda i=i: i, done)
    started = time.monotonic()
    await preparing.wait(0.3)  # the round waits at most its timeout for the slow one
    assert 0.25 < time.monotonic() - started < 5
    assert sorted(seen) == list(range(20))
    gate.set()
    for _ in range(200):
        if "slow" in seen:
            break
        await asyncio.sleep(0.01)
    assert seen[-1] == "slow"
    pool.close()


async def test_a_failing_completion_does_not_keep_the_others_from_theirs() -> None:
    pool, seen = PreparePool(1, "t"), []

    def done(value, exc) -> None:
        if value == 3:
            raise RuntimeError("a bug in one completion")
        seen.append(value)

    preparing = pool.round()
    for i in range(6):
        preparing.submit(lambda i=i: i, done)
    await preparing.wait(10)
    assert seen == [0, 1, 2, 4, 5]
    pool.close()


async def test_closing_drops_the_jobs_not_started_and_calls_no_more_completions() -> None:
    pool, seen, gate = PreparePool(1, "t"), [], threading.Event()
    done = _recorder(threading.get_ident(), seen)
    preparing = pool.round()
    preparing.submit(lambda: gate.wait(10) and "running", done)
    ran = []
    for i in range(5):
        preparing.submit(lambda i=i: ran.append(i), done)
    await asyncio.sleep(0.05)
    pool.close()
    gate.set()
    await asyncio.sleep(0.2)
    assert ran == [] and seen == []
    preparing.submit(lambda: ran.append("late"), done)  # after close: dropped too
    await asyncio.sleep(0.05)
    assert ran == []


async def test_a_round_with_nothing_to_prepare_does_not_wait() -> None:
    started = time.monotonic()
    await PreparePool(1, "t").round().wait(5)
    assert time.monotonic() - started < 0.1
