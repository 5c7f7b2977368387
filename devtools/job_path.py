"""The package files one job runs through, in the order first entered: `python -m devtools.job_path`.

What a newcomer reads to follow a job: its record decoded at the worker's edge, the job prepared,
packed, run and its reply encoded (`worker/envelope.py` and `ScoringEngine`), on a tiny random model of
the kind named (causal, classification). The worker's queues and Kafka's I/O are left out: they are the
same for every job and kind (docs/architecture.md lists them). One warm call first, so imports and
first-call set-up are not counted; then a profiler notes each file a call enters.

`--worker` follows the whole path instead, record to reply: a worker runs on the embedded broker, one
warm job first, then the files every thread enters while one more job is produced and its reply read
(the test's producer and reader are aiokafka's, outside the package). The worker's idle loops (its
poll, the metrics) run in that window too; the files they enter when no job is there are marked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import kafka_scorer

PACKAGE = Path(kafka_scorer.__file__).parent


@dataclass
class _Record:
    """A consumed record as the worker's edge reads it."""

    value: bytes
    headers: list[tuple[str, bytes | None]] = field(
        default_factory=lambda: [("content-type", b"application/json")]
    )
    key: bytes | None = b"k"
    topic: str = "jobs"
    partition: int = 0
    offset: int = 0
    timestamp: int = 1_700_000_000_000


def job_path(kind: str) -> list[str]:
    from kafka_scorer.checkpoints.tiny_models import build_tiny_model
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.worker.envelope import Inbound, RecordCodec

    directory = build_tiny_model(tempfile.mkdtemp(prefix="job-path-"), "qwen3", kind)
    engine = Scorer(str(directory), dtype="float32", device="cpu").engine
    codec = RecordCodec("replies", lambda topic: f"{topic}.dlq", 1 << 20, engine.served.name)
    job: dict[str, object] = {"id": "j", "query": "which one", "items": ["a", "bb", "ccc"]}
    if kind == "causal":
        job["label_token_ids"] = [5, 6]
    record = _Record(json.dumps(job).encode())

    def one() -> None:
        inbound = codec.decode_record(record)
        assert isinstance(inbound, Inbound), inbound
        prepared = engine.prepare(inbound.job, inbound.job_id)
        (result,) = engine.run_packed(engine.pack([prepared]))
        assert result.error is None, result.error
        codec.encode_record(result, inbound.origin)

    one()
    entered: list[str] = []

    def note(frame, event: str, arg: object) -> None:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(str(PACKAGE)) and name not in entered:
            entered.append(name)

    sys.setprofile(note)
    threading.setprofile(note)
    try:
        one()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return [_relative(name) for name in entered]


def _relative(name: str) -> str:
    return str(Path(name).relative_to(PACKAGE))


class _Entered:
    """A profiler on every thread, installed before the worker starts its threads: while `into` is set,
    it notes each package file a call enters."""

    def __init__(self) -> None:
        self.into: dict[str, None] | None = None

    def __call__(self, frame, event: str, arg: object) -> None:
        into, name = self.into, frame.f_code.co_filename
        if into is not None and event == "call" and name.startswith(str(PACKAGE)) and name not in into:
            into[name] = None


async def _through_worker(kind: str, entered: _Entered) -> tuple[list[str], set[str]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from kafka_scorer.checkpoints.tiny_models import build_tiny_model
    from kafka_scorer.config import Settings
    from kafka_scorer.embedded.broker import EmbeddedBroker
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.kafka.admin import create_topics
    from kafka_scorer.worker.service import Worker

    directory = build_tiny_model(tempfile.mkdtemp(prefix="job-path-"), "qwen3", kind)
    engine = Scorer(str(directory), dtype="float32", device="cpu").engine
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        await create_topics(bootstrap, ["jobs", "replies"], 1)
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            model=str(directory),
            bootstrap_servers=bootstrap,
            request_topics=["jobs"],
            reply_topic="replies",
            group_id="job-path",
            metrics_port=0,
            fetch_max_wait_ms=10,
            max_batch_wait_ms=5,
        )
        stop = asyncio.Event()
        worker = asyncio.create_task(Worker(settings, engine).run(stop))
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        replies = AIOKafkaConsumer("replies", bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await producer.start()
        await replies.start()
        try:
            await _answered(producer, replies, _job(kind, "warm"))
            idle: dict[str, None] = {}
            entered.into = idle
            await asyncio.sleep(3)
            path: dict[str, None] = {}
            entered.into = path
            await _answered(producer, replies, _job(kind, "measured"))
            entered.into = None
        finally:
            stop.set()
            await asyncio.wait_for(worker, 60)
            await producer.stop()
            await replies.stop()
    return [_relative(name) for name in path], {_relative(name) for name in idle}


def _job(kind: str, job_id: str) -> bytes:
    job: dict[str, object] = {"id": job_id, "query": "which one", "items": ["a", "bb", "ccc"]}
    if kind == "causal":
        job["label_token_ids"] = [5, 6]
    return json.dumps(job).encode()


async def _answered(producer, replies, value: bytes) -> None:
    """Produce one job and read replies until its own is there."""
    job_id = json.loads(value)["id"]
    await producer.send_and_wait("jobs", value, headers=[("content-type", b"application/json")])
    while True:
        for records in (await replies.getmany(timeout_ms=30_000)).values():
            if any(json.loads(r.value)["id"] == job_id for r in records):
                return


def worker_path(kind: str) -> tuple[list[str], set[str]]:
    """The files the whole path enters, in order, and those the worker's idle loops enter too."""
    entered = _Entered()
    sys.setprofile(entered)
    threading.setprofile(entered)
    try:
        return asyncio.run(_through_worker(kind, entered))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("causal", "classification"), default="causal")
    parser.add_argument("--worker", action="store_true", help="the whole path, record to reply")
    args = parser.parse_args()
    if not args.worker:
        files = job_path(args.kind)
        print("\n".join(files))
        print(f"{len(files)} files")
        return
    files, idle = worker_path(args.kind)
    for name in files:
        print(f"{name}{'  (idle loops too)' if name in idle else ''}")
    folders = sorted({name.split("/")[0] for name in files})
    counts = ", ".join(f"{folder} {sum(n.startswith(folder + '/') for n in files)}" for folder in folders)
    print(f"{len(files)} files ({counts}); {len(set(files) & idle)} of them entered by the idle loops too")


if __name__ == "__main__":
    main()
