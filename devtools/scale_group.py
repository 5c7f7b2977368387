"""The worker group scaled by lag under a load ramp, measured (issue 45 item 3). Not in the wheel.

What KEDA's Kafka scaler does, in one loop: every `poll_s` it reads the group's lag (log end minus
committed offset, summed over the request topic's partitions) and wants ceil(lag / lag_threshold)
workers, clamped to [1, max_workers]. Like the HPA behind KEDA it moves one worker at a time, up after
`up_cooldown_s`, down only after the wish has stayed lower for `down_window_s` (the HPA's
stabilisation window, 300 s by default, shortened here). A worker is a `kafka-scorer worker` process
(a pod); removing one is SIGTERM (its graceful drain), as Kubernetes does.

The load: jobs produced with acks=all at a rate that ramps up, holds, ramps down and stops. Each job's
id carries its send time; each answer's latency is the reply record's timestamp minus it.

Reported per scaling event: the pause (the longest gap with no answer produced, in the `window_s`
after the event), the jobs answered twice since the event, and p50/p99 latency of answers produced
in event windows vs between them; and that every job sent was answered (0 lost).

    PYTHONPATH=. .venv/bin/python -m devtools.scale_group [--max-workers 4] [--bootstrap HOST:PORT,...]

Without `--bootstrap` it starts the three-node cluster (devtools/kafka_cluster.py) and stops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata

from kafka_scorer.wire.protocol import Job, decode_result, encode_job


@dataclass(frozen=True)
class Plan:
    """The load ramp and the scaler's rules."""

    partitions: int = 8
    peak_rate: float = 900.0  # jobs/s at the top of the ramp
    ramp_s: float = 40.0
    hold_s: float = 40.0
    lag_threshold: int = 40  # KEDA's lagThreshold: wanted workers = ceil(lag / this)
    max_workers: int = 4
    poll_s: float = 2.0  # KEDA's pollingInterval (30 s by default)
    up_cooldown_s: float = 10.0
    down_window_s: float = 20.0  # the HPA's scale-down stabilisation window (300 s by default)
    window_s: float = 30.0  # after an event, the span its pause, duplicates and latency count in
    static: bool = False  # give each worker a group_instance_id (static membership)

    def rate(self, t: float) -> float:
        """Jobs per second `t` seconds into the run: up, hold, down, then a tenth of the peak (so the
        scale-down events have answers whose pause can be measured)."""
        if t < self.ramp_s:
            return self.peak_rate * max(0.1, t / self.ramp_s)
        if t < self.ramp_s + self.hold_s:
            return self.peak_rate
        down = t - self.ramp_s - self.hold_s
        return self.peak_rate * max(0.1, 1 - down / self.ramp_s)

    @property
    def load_s(self) -> float:
        return 2 * self.ramp_s + self.hold_s


@dataclass
class Event:
    at: float  # time.time()
    change: str  # "1 -> 2"
    lag: int


@dataclass
class Run:
    """What the run saw: jobs sent (id -> send time), answers (id, produced at), scaling events."""

    sent: dict[str, float] = field(default_factory=dict)
    answers: list[tuple[str, float]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    workers: list[int] = field(default_factory=list)  # worker count after each poll, for the log
    partition_of: dict[str, int] = field(default_factory=dict)  # job id -> request partition
    back_to_one: asyncio.Event = field(default_factory=asyncio.Event)  # the tail load stops then


class Group:
    """The worker processes of one group, started and SIGTERMed like pods."""

    def __init__(self, flags: list[str], log_dir: Path, static: bool) -> None:
        self.flags, self.log_dir, self.static = flags, log_dir, static
        self.procs: list[subprocess.Popen[bytes]] = []
        self._started = 0

    def add(self) -> None:
        self._started += 1
        extra = ["--group-instance-id", f"scaler-{self._started}"] if self.static else []
        with open(self.log_dir / f"worker-{self._started}.log", "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "kafka_scorer", "worker", *self.flags, *extra],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )

    def remove(self) -> None:
        """SIGTERM the newest worker (a scale-down picks a pod; which one does not matter here)."""
        proc = self.procs.pop()
        proc.send_signal(signal.SIGTERM)

    def exited(self) -> list[int]:
        return [p.returncode for p in self.procs if p.poll() is not None]

    def close(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


async def lag(bootstrap: str, group: str, topic: str, partitions: int, reader: AIOKafkaConsumer) -> int:
    """The group's lag over the topic, as KEDA computes it (a partition never committed: its whole log)."""
    from aiokafka.admin import AIOKafkaAdminClient

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends = await reader.end_offsets(tps)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
    finally:
        await admin.close()
    return sum(max(0, ends[tp] - max(0, committed[tp].offset if tp in committed else 0)) for tp in tps)


async def produce(bootstrap: str, topic: str, plan: Plan, run: Run, done: asyncio.Event) -> None:
    """The ramp: each tick sends the jobs the rate has made due since the last."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        began, last, due, seq, pending = time.monotonic(), 0.0, 0.0, 0, []
        while (t := time.monotonic() - began) < plan.load_s or not run.back_to_one.is_set():
            due, last = due + plan.rate(t) * (t - last), t
            while seq < int(due):
                pending.append((f"j{seq}", await _send(producer, topic, f"j{seq}", seq)))
                run.sent[f"j{seq}"] = time.time()
                seq += 1
            await asyncio.sleep(0.05)
        for job_id, future in pending:
            run.partition_of[job_id] = (await future).partition
    finally:
        await producer.stop()
        done.set()


async def _send(
    producer: AIOKafkaProducer, topic: str, job_id: str, seq: int
) -> asyncio.Future[RecordMetadata]:
    job = Job(
        id=job_id, query=[5, 17, 42, seq % 300 + 4], items=[[7, 8], [9, 10, 11]], label_token_ids=[1, 2]
    )
    return await producer.send(topic, encode_job(job), key=job_id.encode())


async def read_answers(bootstrap: str, topic: str, partitions: int, run: Run, stop: asyncio.Event) -> None:
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50)
    await reader.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        while not stop.is_set():
            for records in (await reader.getmany(timeout_ms=200)).values():
                for r in records:
                    result = decode_result(r.value, dict(r.headers).get("content-type", b"").decode() or None)
                    run.answers.append((result.id or "", r.timestamp / 1000))
    finally:
        await reader.stop()


async def scale(
    args: argparse.Namespace, plan: Plan, topics: tuple[str, str, str], run: Run, group: Group
) -> None:
    """The KEDA loop, until the load has stopped and every job is answered, then down to one worker."""
    requests, _replies, group_id = topics
    reader = AIOKafkaConsumer(bootstrap_servers=args.bootstrap)
    await reader.start()
    try:
        group.add()
        last_change, lower_since = time.monotonic(), None
        while True:
            await asyncio.sleep(plan.poll_s)
            assert not group.exited(), f"a worker exited: {group.exited()}"
            current = len(group.procs)
            try:
                now_lag = await lag(args.bootstrap, group_id, requests, plan.partitions, reader)
            except KafkaError as exc:  # a coordinator moving or not there yet: KEDA skips the poll too
                print(f"{time.strftime('%X')} lag unknown ({exc!r}); next poll", flush=True)
                continue
            want = min(plan.max_workers, max(1, math.ceil(now_lag / plan.lag_threshold)))
            run.workers.append(current)
            now = time.monotonic()
            lower_since = (lower_since or now) if want < current else None
            if want > current and now - last_change >= plan.up_cooldown_s:
                group.add()
            elif lower_since is not None and now - lower_since >= plan.down_window_s:
                group.remove()
                lower_since = now
            else:
                if current == 1 and run.events and run.sent:
                    run.back_to_one.set()  # back to one worker after the peak: the tail load stops
                if current == 1 and args.load_done.is_set() and run.sent and _all_answered(run):
                    return
                continue
            last_change = now
            run.events.append(Event(time.time(), f"{current} -> {len(group.procs)}", now_lag))
            print(f"{time.strftime('%X')} lag {now_lag}: workers {current} -> {len(group.procs)}", flush=True)
    finally:
        await reader.stop()


def _all_answered(run: Run) -> bool:
    return set(run.sent) <= {job for job, _ in run.answers}


def rebalances(log_dir: Path) -> list[tuple[float, float]]:
    """(first revoke, last assignment) of each rebalance, from the workers' own log lines: a scale-up
    rebalances only once the new process has started (seconds after the scaler's decision)."""
    marks: list[tuple[float, str]] = []
    for path in log_dir.glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            kind = (
                "revoked"
                if "partitions revoked" in line
                else "assigned"
                if "partitions assigned" in line
                else ""
            )
            if kind:
                marks.append((datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp(), kind))
    spans: list[list[float]] = []
    for at, kind in sorted(marks):
        if kind == "revoked" and (not spans or at - spans[-1][1] > 2.0):
            spans.append([at, at])
        elif spans:
            spans[-1][1] = max(spans[-1][1], at)
    return [(a, b) for a, b in spans]


def report(run: Run, plan: Plan, log_dir: Path) -> dict[str, object]:
    """Per event (the rebalance it caused, from the workers' logs): the rebalance's length, the pause
    (no answer at all), the longest a partition went unanswered, the jobs answered twice, latency of the
    answers produced from 1 s before the rebalance to `window_s` after; and the figures between."""
    first: dict[str, float] = {}
    seen: dict[str, int] = {}
    for job, at in sorted(run.answers, key=lambda a: a[1]):
        seen[job] = seen.get(job, 0) + 1
        first.setdefault(job, at)
    latency = {job: at - run.sent[job] for job, at in first.items() if job in run.sent}
    times = sorted(at for _, at in run.answers)
    spans = rebalances(log_dir)
    rows, in_events = [], set()
    for event in run.events:  # each rebalance belongs to the first event before it that has none yet
        span = next(((a, b) for a, b in spans if a >= event.at - 0.5), None)
        spans = [x for x in spans if span is None or x[0] > span[0]]
        if span is None or not times:
            rows.append({"event": event.change, "lag": event.lag, "rebalance": "none seen"})
            continue
        start, end = span[0] - 1.0, span[1] + plan.window_s
        inside = [t for t in times if start <= t <= end]
        edges = [start, *inside, min(end, times[-1])]
        pause = max(b - a for a, b in itertools.pairwise(edges))
        jobs = {job for job, at in run.answers if start <= at <= end}
        in_events |= jobs
        rows.append(
            {
                "event": event.change,
                "lag": event.lag,
                "after_decision_s": round(span[0] - event.at, 1),
                "rebalance_s": round(span[1] - span[0], 2),
                "pause_s": round(pause, 2),
                "partition_stall_s": round(_partition_stall(run, start, end), 2),
                "answered_twice": sum(1 for job in jobs if seen[job] > 1),
                **_pct(latency, jobs),
            }
        )
    between = set(latency) - in_events
    lost = len(set(run.sent) - set(first))
    return {
        "events": rows,
        "between": _pct(latency, between),
        "lost": lost,
        "sent": len(run.sent),
        "answered_twice": sum(1 for n in seen.values() if n > 1),
    }


def _partition_stall(run: Run, start: float, end: float) -> float:
    """The longest any request partition went without an answer in [start, end] (a partition that
    moves between workers stalls while the whole group, its other partitions answering, may not)."""
    by_partition: dict[int, list[float]] = {}
    for job, at in run.answers:
        if start <= at <= end and job in run.partition_of:
            by_partition.setdefault(run.partition_of[job], []).append(at)
    last = max((at for _, at in run.answers if at <= end), default=start)
    gaps = [
        max(b - a for a, b in itertools.pairwise([start, *sorted(times), last]))
        for times in by_partition.values()
    ]
    return max(gaps, default=0.0)


def _pct(latency: dict[str, float], jobs: set[str]) -> dict[str, float]:
    values = sorted(latency[j] for j in jobs if j in latency)
    if not values:
        return {"n": 0}
    pick = lambda q: round(values[min(len(values) - 1, int(q * len(values)))], 3)  # noqa: E731
    return {"n": len(values), "p50_s": pick(0.50), "p99_s": pick(0.99)}


async def main(args: argparse.Namespace) -> dict[str, object]:
    from kafka_scorer.kafka.admin import create_topics

    plan = Plan(
        max_workers=args.max_workers,
        static=args.static,
        peak_rate=args.peak_rate,
        lag_threshold=args.lag_threshold,
    )
    tag = uuid.uuid4().hex[:6]
    topics = (f"scale-req-{tag}", f"scale-res-{tag}", f"scale-group-{tag}")
    await create_topics(args.bootstrap, list(topics[:2]), plan.partitions, replication=3)
    flags = [
        "--model", str(args.model), "--device", "cpu", "--dtype", "float32",
        "--bootstrap-servers", args.bootstrap, "--request-topics", topics[0], "--reply-topic", topics[1],
        "--group-id", topics[2], "--metrics-port", "0", "--session-timeout-ms", "6000",
        "--heartbeat-interval-ms", "500", "--rebalance-grace-s", "3", "--max-batch-wait-ms", "5",
    ]  # fmt: skip
    run, group = Run(), Group(flags, args.log_dir, plan.static)
    args.load_done = asyncio.Event()
    stop_reading = asyncio.Event()
    reading = asyncio.create_task(read_answers(args.bootstrap, topics[1], plan.partitions, run, stop_reading))
    try:
        await asyncio.sleep(0)
        loading = asyncio.create_task(_load_after_first(args, plan, topics[0], run))
        await scale(args, plan, topics, run, group)
        await loading
        await asyncio.sleep(3.0)  # late duplicates
    finally:
        stop_reading.set()
        await reading
        group.close()
    raw = {"sent": run.sent, "answers": run.answers, "partition_of": run.partition_of}
    (args.log_dir / "run.json").write_text(json.dumps({**raw, "events": [vars(e) for e in run.events]}))
    return report(run, plan, args.log_dir)


async def _load_after_first(args: argparse.Namespace, plan: Plan, topic: str, run: Run) -> None:
    """The ramp starts once the first worker has answered a probe job: its start-up is no scaling event."""
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, acks="all")
    await producer.start()
    try:
        await (await _send(producer, topic, "probe", 0))
    finally:
        await producer.stop()
    while "probe" not in {job for job, _ in run.answers}:
        await asyncio.sleep(0.5)
    run.answers.clear()
    print(f"{time.strftime('%X')} first worker answering; the ramp starts", flush=True)
    await produce(args.bootstrap, topic, plan, run, args.load_done)


def _model(directory: Path) -> Path:
    """The quickstart's tiny causal model, written once (`kafka-scorer model causal DIR`)."""
    if not (directory / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "kafka_scorer", "model", "causal", str(directory)], check=True)
    return directory


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="an existing cluster; without it the three-node cluster starts")
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--peak-rate", type=float, default=900.0, help="jobs/s at the top of the ramp")
    parser.add_argument("--lag-threshold", type=int, default=40, help="KEDA's lagThreshold")
    parser.add_argument("--static", action="store_true", help="static membership (group_instance_id)")
    parser.add_argument(
        "--model", type=Path, default=Path(tempfile.gettempdir()) / "kafka-scorer-scale-model"
    )
    parser.add_argument("--log-dir", type=Path, default=Path(tempfile.mkdtemp(prefix="scale-group-")))
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the client's retries while leaders settle are no news here
    args.model = _model(args.model)
    print(f"worker logs in {args.log_dir}; load average {os.getloadavg()}", flush=True)
    if args.bootstrap:
        print(json.dumps(asyncio.run(main(args)), indent=1))
        return
    from devtools.kafka_cluster import KafkaCluster

    with KafkaCluster() as cluster:
        args.bootstrap = cluster.bootstrap_servers
        print(json.dumps(asyncio.run(main(args)), indent=1))
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    cli()
