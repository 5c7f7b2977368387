"""Fault injection for worker subprocesses: put this folder on PYTHONPATH and set one of

- SCORER_TEST_HANG_IN_COMMIT_AFTER=N: the worker's transactional producer commits N transactions, then
  hangs inside the next `commit_transaction` (its results and offsets already sent, EndTxn not),
  printing a marker line. A SIGKILL then is a crash with a transaction open, every time, instead of
  whenever the timing happens to allow it.
- SCORER_TEST_DEVICE_FAULT_AFTER=N: after the warm-up (whose forward count is the engine's business),
  the model runner runs N forward passes, then every later one raises the error CUDA gives after an
  illegal memory access (printing a marker line first): a device
  fault that poisons the process, on a machine with no GPU.
- SCORER_TEST_START_GATE=PATH: the worker's producer, its first Kafka client (the transactional one
  fences its predecessor as it starts, the consumer joins the group after it), starts only once PATH
  exists. A restart can then load its model while the worker it replaces still runs, and touch Kafka
  only after that one was killed: the same restart, without the seconds of start-up in between.
"""

import os

if os.environ.get("SCORER_TEST_START_GATE"):
    import asyncio
    import pathlib

    import aiokafka

    _gate = pathlib.Path(os.environ["SCORER_TEST_START_GATE"])
    _start = aiokafka.AIOKafkaProducer.start

    async def _start_after_gate(self: aiokafka.AIOKafkaProducer) -> None:
        while not _gate.exists():
            await asyncio.sleep(0.02)
        await _start(self)

    aiokafka.AIOKafkaProducer.start = _start_after_gate

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

if os.environ.get("SCORER_TEST_DEVICE_FAULT_AFTER"):
    from kafka_scorer.engine.run import runner
    from kafka_scorer.engine.scoring_engine import ScoringEngine

    _forwards_left = int(os.environ["SCORER_TEST_DEVICE_FAULT_AFTER"])
    _forward = runner.ModelRunner.forward
    _warm_up = ScoringEngine.warm_up
    _armed = []

    def _warm_up_then_arm(self):  # type: ignore[no-untyped-def]
        _warm_up(self)
        _armed.append(True)

    def _forward_or_fault(self, batch):  # type: ignore[no-untyped-def]
        global _forwards_left
        if not _armed:
            return _forward(self, batch)
        if _forwards_left <= 0:
            print("FAULT-INJECTION: illegal memory access in forward", flush=True)
            raise RuntimeError(
                "CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call"
            )
        _forwards_left -= 1
        return _forward(self, batch)

    runner.ModelRunner.forward = _forward_or_fault
    ScoringEngine.warm_up = _warm_up_then_arm
