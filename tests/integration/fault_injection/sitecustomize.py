"""Fault injection for worker subprocesses: put this folder on PYTHONPATH and set
SCORER_TEST_HANG_IN_COMMIT_AFTER=N, and the worker's transactional producer commits N transactions,
then hangs inside the next `commit_transaction` (its results and offsets already sent, EndTxn not),
printing a marker line. A SIGKILL then is a crash with a transaction open, every time, instead of
whenever the timing happens to allow it."""

import os

if os.environ.get("SCORER_TEST_HANG_IN_COMMIT_AFTER"):
    import asyncio

    import aiokafka

    _limit = int(os.environ["SCORER_TEST_HANG_IN_COMMIT_AFTER"])
    _commit = aiokafka.AIOKafkaProducer.commit_transaction
    _calls = 0

    async def _commit_or_hang(self: aiokafka.AIOKafkaProducer) -> None:
        global _calls
        _calls += 1
        if _calls > _limit:
            print("FAULT-INJECTION: hanging in commit_transaction", flush=True)
            await asyncio.Event().wait()
        await _commit(self)

    aiokafka.AIOKafkaProducer.commit_transaction = _commit_or_hang
