"""Plain aiokafka helpers for the integration tests: topics, producing, reading back, offsets, workers.

Reading back uses a group-less consumer that assigns every partition and starts at the beginning, so
what a test sees is what the broker holds, independent of the worker's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from pydantic import SecretStr

from devtools.processes import die_with_parent
from kafka_scorer.config import Settings
from kafka_scorer.kafka.admin import create_topics
from kafka_scorer.wire.protocol import Result, decode_result

ROOT = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).parent / "fault_injection"


def with_faults(**env: str) -> dict[str, str]:
    """A worker process's extra environment: `env` and fault_injection/ on PYTHONPATH, whose
    sitecustomize.py reads the SCORER_TEST_* variables among them."""
    path = os.pathsep.join([str(FAULTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": path, **env}


def gated(gate: Path, **env: str) -> dict[str, str]:
    """`with_faults` for a worker whose Kafka clients start only once `gate` exists (a restart that loads
    its model while the worker it replaces still runs)."""
    return with_faults(SCORER_TEST_START_GATE=str(gate), **env)


@dataclass(frozen=True)
class BrokerInfo:
    bootstrap: str
    name: str
    transactions: bool
    min_session_timeout_ms: int  # real Kafka and noida-db refuse sessions under 6 s

    def session_settings(self) -> dict[str, int]:
        """Fast group settings (BROKERS.md): a rebalance takes about half the session timeout."""
        session = max(1500, self.min_session_timeout_ms)
        return {"session_timeout_ms": session, "heartbeat_interval_ms": min(300, session // 5)}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class Out:
    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int | None = None


async def produce(bootstrap: str, records: Sequence[Out], max_request_size: int = 1 << 20) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=max_request_size)
    await producer.start()
    try:
        futures = [
            await producer.send(r.topic, r.value, key=r.key, headers=r.headers, partition=r.partition)
            for r in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_topic(
    bootstrap: str,
    topic: str,
    until: Callable[[list[ConsumerRecord]], bool],
    timeout_s: float,
    isolation_level: str = "read_uncommitted",
    settle_s: float = 0.0,
) -> list[ConsumerRecord]:
    """Every record of `topic` from the start, until `until(records)` holds (then `settle_s` more, to
    catch duplicates that would arrive late) or the timeout passes."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=20,
        isolation_level=isolation_level,
        max_partition_fetch_bytes=32 << 20,
    )
    await consumer.start()
    try:
        partitions = await _partitions(consumer, topic, timeout_s)
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        settled_at: float | None = None
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=100)
            for recs in batch.values():
                records.extend(recs)
            if settled_at is None and until(records):
                settled_at = time.monotonic()
            if settled_at is not None and time.monotonic() - settled_at >= settle_s:
                break
        return records
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str, timeout_s: float = 5.0) -> list[TopicPartition]:
    """The topic's partitions, waiting up to `timeout_s` (at least 5 s) for a topic that a worker's first
    answer is still to create (a reply topic auto-created on produce)."""
    deadline = time.monotonic() + max(5.0, timeout_s)
    while time.monotonic() < deadline:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return [TopicPartition(topic, p) for p in sorted(parts)]
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.05)
    raise AssertionError(f"topic {topic} has no partitions")


async def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        await consumer.stop()


async def end_offsets(bootstrap: str, topic: str, partitions: int, count: int) -> dict[int, int]:
    """One past the last offset of each partition, read from the records themselves (`count` of them).

    Not ListOffsets: the embedded tansu 0.6.0 answers it with a smaller number once a partition holds
    multi-record batches (measured here: 144 for a partition whose last record has offset 166).
    """
    records = await read_topic(bootstrap, topic, lambda rs: len(rs) >= count, timeout_s=30)
    ends = dict.fromkeys(range(partitions), 0)
    for record in records:
        ends[record.partition] = max(ends[record.partition], record.offset + 1)
    return ends


async def wait_for_commits(
    bootstrap: str, group: str, topic: str, partitions: int, count: int, timeout_s: float = 15.0
) -> tuple[dict[int, int | None], dict[int, int]]:
    """Poll until the group's committed offsets reach the end offsets (commits trail acknowledgements)."""
    ends = await end_offsets(bootstrap, topic, partitions, count)
    deadline = time.monotonic() + timeout_s
    while True:
        committed = await committed_offsets(bootstrap, group, topic, partitions)
        if committed == ends or time.monotonic() > deadline:
            return committed, ends
        await asyncio.sleep(0.2)


def worker_settings(broker: BrokerInfo, model: Path, **overrides: object) -> Settings:
    base: dict[str, object] = {
        "model": str(model),
        "dtype": "float32",
        "device": "cpu",
        "bootstrap_servers": broker.bootstrap,
        "fetch_max_wait_ms": 10,
        "max_batch_wait_ms": 5,
        "metrics_port": 0,
        "shutdown_grace_s": 20.0,
        "rebalance_grace_s": 5.0,
        **broker.session_settings(),
    }
    base.update(overrides)
    return Settings(_env_file=None, **base)  # type: ignore[arg-type]


def decode_replies(records: Iterable[ConsumerRecord]) -> list[Result]:
    """Decoded by the content-type header the worker must set on every reply (SPEC §3), not by sniffing."""
    return [decode_result(r.value, dict(r.headers)["content-type"].decode()) for r in records]


@dataclass(frozen=True)
class Topics:
    """A request topic, its reply topic and a consumer group made for one test: all tests share the
    session broker, so each gets names nobody else uses, and the helpers below need no more arguments."""

    broker: BrokerInfo
    requests: str
    replies: str
    group: str
    partitions: int

    @property
    def dead_letters(self) -> str:
        return f"{self.requests}.DLT"  # the worker's default (SPEC §3)

    def settings(self, model: Path, **overrides: object) -> Settings:
        """A worker that reads `requests` in `group` and answers on `replies` (unless overridden)."""
        topics = {"request_topics": [self.requests], "reply_topic": self.replies, "group_id": self.group}
        return worker_settings(self.broker, model, **{**topics, **overrides})

    async def read_replies(self, count: int, timeout_s: float, settle_s: float = 0.0) -> list[ConsumerRecord]:
        """Reply records until `count` of them are there (then `settle_s` more, for late duplicates)."""
        return await read_topic(
            self.broker.bootstrap, self.replies, lambda rs: len(rs) >= count, timeout_s, settle_s=settle_s
        )

    async def read_answers(
        self, distinct: int, timeout_s: float, settle_s: float = 0.0, committed_only: bool = False
    ) -> list[Result]:
        """Results until `distinct` different job ids are among them: after a crash, redelivered
        duplicates make the record count a poor stop."""

        def enough(records: list[ConsumerRecord]) -> bool:
            return len(records) >= distinct and len({r.id for r in decode_replies(records)}) >= distinct

        records = await read_topic(
            self.broker.bootstrap,
            self.replies,
            enough,
            timeout_s,
            isolation_level="read_committed" if committed_only else "read_uncommitted",
            settle_s=settle_s,
        )
        return decode_replies(records)

    async def wait_for_answers(
        self, distinct: int, worker: WorkerProcess, timeout_s: float, committed_only: bool = False
    ) -> list[Result]:
        """`read_answers` in short reads, so a worker that died fails the test at once, with its log."""
        deadline = time.monotonic() + timeout_s
        while True:
            results = await self.read_answers(distinct, timeout_s=1.0, committed_only=committed_only)
            if len({r.id for r in results}) >= distinct:
                return results
            if worker.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{len(results)} results; worker log:\n{worker.output()[-4000:]}")
            await asyncio.sleep(0.1)

    async def wait_for_commits(
        self, count: int, timeout_s: float = 15.0
    ) -> tuple[dict[int, int | None], dict[int, int]]:
        """The group's committed offsets once they reach the ends of the `count` requests (or time out)."""
        return await wait_for_commits(
            self.broker.bootstrap, self.group, self.requests, self.partitions, count, timeout_s
        )


async def fresh_topics(broker: BrokerInfo, partitions: int = 3, dead_letters: bool = False) -> Topics:
    """New request and reply topics (and the dead-letter topic, where the test reads it) and a group name."""
    topics = Topics(broker, unique("req"), unique("res"), unique("group"), partitions)
    names = [topics.requests, topics.replies] + ([topics.dead_letters] if dead_letters else [])
    await create_topics(broker.bootstrap, names, partitions)
    return topics


def hold_device(monkeypatch, scorer) -> threading.Event:
    """A switch on `scorer`'s forward passes: cleared, each pass waits (up to 60 s) until it is set
    again, so jobs stay in flight, unanswered, through whatever the test does meanwhile. Set at first."""
    device = threading.Event()
    device.set()
    run_packed = scorer.engine.run_packed

    def held_run_packed(packed):
        device.wait(60)
        return run_packed(packed)

    monkeypatch.setattr(scorer.engine, "run_packed", held_run_packed)
    return device


class InProcessWorker:
    """`Worker.run` as a task of the test's event loop; `stop()` is the SIGTERM path without a signal."""

    def __init__(self, settings: Settings, engine, tracing=None) -> None:
        """`engine`: the seam the worker drives (a `Scorer`'s `.engine`, or a test's wrapper of one)."""
        from kafka_scorer.worker.service import Worker

        self.worker = Worker(settings, engine, tracing=tracing)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[int] | None = None

    async def __aenter__(self) -> InProcessWorker:
        self._task = asyncio.create_task(self.worker.run(self._stop))
        await self.wait_ready()
        return self

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.worker.ready:
            assert self._task is not None
            if self._task.done():
                raise AssertionError(f"worker exited at start: rc={self._task.result()}")
            if time.monotonic() > deadline:
                raise AssertionError("worker not ready in time")
            await asyncio.sleep(0.02)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self, timeout_s: float = 60.0) -> int:
        self._stop.set()
        assert self._task is not None
        return await asyncio.wait_for(self._task, timeout_s)

    async def __aexit__(self, *exc_info: object) -> None:
        if self.running:
            await self.stop()


WORKER_COMMAND = [sys.executable, "-m", "kafka_scorer", "worker"]


def settings_flags(settings: Settings) -> list[str]:
    """The settings as `kafka-scorer worker` flags (only those that differ from the defaults)."""
    defaults = Settings.model_construct()
    flags: list[str] = []
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if value == getattr(defaults, name, None):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, SecretStr):  # str() would give the mask, not the password
            value = value.get_secret_value()
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            flags += [flag, ",".join(value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags


class WorkerProcess:
    """`kafka-scorer worker` as a real child process, for tests about signals and crashes.

    `async with` waits for "worker ready" and kills the process on the way out, whatever the test did;
    the log stays readable after that, for the assertion messages."""

    def __init__(
        self, settings: Settings, name: str = "worker", extra_env: dict[str, str] | None = None
    ) -> None:
        self.args = [*WORKER_COMMAND, *settings_flags(settings)]
        self._log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)  # noqa: SIM115
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_SCORER_")}
        env.update(
            TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **(extra_env or {})
        )
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # a test process ended by its timeout leaves no worker serving on
        )
        self._closed_output: str | None = None

    async def __aenter__(self) -> WorkerProcess:
        try:
            await self.wait_for_log("worker ready")
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def output(self) -> str:
        if self._closed_output is not None:
            return self._closed_output
        return Path(self._log.name).read_text(errors="replace")

    async def wait_for_log(self, needle: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited (rc={self.proc.returncode}):\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in the worker log:\n{self.output()[-4000:]}")
            await asyncio.sleep(0.05)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    async def wait(self, timeout_s: float = 60.0) -> int:
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"worker did not exit in {timeout_s}s:\n{self.output()[-4000:]}")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def close(self) -> None:
        if self._closed_output is not None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._closed_output = self.output()
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)
