"""The benchmark: the same jobs through every contender, in one process and one run, side by side.

Contenders:
- (a) our engine with MIS off (`multi_item: false`): every item is its own `query + item` pair;
- (b) our engine with MIS on, once per attention backend (`b:dense`, `b:cascade`, ...);
- (c) the transformers baseline (`bench/baseline.py`): padded pairs, full logits, log_softmax;
- (d) the full worker through a real Kafka-protocol broker (embedded tansu), same scorer in-process.

How a run is timed, so the figures mean the same thing for every contender:
- Each contender first scores a small warm-up slice (untimed): lazy init, allocator, kernel choice.
- A closed-loop client keeps `window` jobs outstanding (enough to fill two token budgets) and submits
  the next job as soon as one is answered. Wall time runs from the first submission to the last answer;
  a job's latency is its answer time minus its submission time. By Little's law latency is then about
  window / throughput: p50/p99 tell how evenly jobs are served, the throughput columns tell the speed.
- Peak memory is what the run adds on top of the loaded weights: CUDA `max_memory_allocated`; CPU the
  kernel's peak-RSS mark (`VmHWM`, reset through /proc/self/clear_refs) after returning freed heap.
- Scores of (a), (b) and (d) are compared with (c) on every job: a benchmark that silently measured a
  broken path would show it here, and the run exits non-zero.
- The compute floor of a run is 2 × matmul parameters × tokens FLOPs over the matmul peak measured in
  the same process (attention FLOPs excluded): floor fraction = floor time / measured time.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kafka_scorer.bench.baseline import BaselineScorer
from kafka_scorer.bench.models import SHAPES, ModelShape, build_shaped_model
from kafka_scorer.bench.workloads import WORKLOADS, Workload, build_workload, with_multi_item, workload_spec
from kafka_scorer.protocol import Job, Result

Scores = list[list[float]]


@dataclass
class BenchConfig:
    device: str = "auto"
    dtype: str = "auto"
    workloads: tuple[str, ...] = WORKLOADS
    model_shape: str | None = None
    """None: cpu-small on CPU, qwen3-0.6b on CUDA."""
    backends: tuple[str, ...] | None = None
    """MIS attention backends for (b); None: every backend that applies to the device."""
    quick: bool = False
    skip_worker: bool = False
    skip_label_kernel: bool = False
    max_batch_tokens: int = 8192
    num_jobs: int | None = None
    repeats: int = 3
    """Most timed runs per contender; the fastest is reported (noise on a shared machine only slows)."""
    repeat_budget_s: float = 15.0
    """No further run once a contender's timed runs took this long: a slow contender runs once."""
    seed: int = 0
    model_dir: str | None = None
    """Where to keep the generated checkpoints between runs; None: a temp dir removed at the end."""
    verbose: bool = True


# --------------------------------------------------------------------------------------- measuring


@dataclass
class RunRecord:
    """What one contender did on one workload; turned into the report's metrics by `summarise`."""

    scores: list[Scores | None]
    errors: list[str]
    latencies: list[float]
    wall_s: float
    forward_tokens: int
    """Tokens the contender ran through the model (padding included for the baseline)."""
    lm_head_rows: int
    """Rows that went through the full-vocabulary LM head."""
    peak_bytes: int
    foreign_cpu_load: float | None = None
    runs: int = 1


@dataclass
class Measured:
    """Filled in when a `RunProbe.measure()` block ends."""

    peak_bytes: int = 0
    foreign_cpu_load: float | None = None
    """Share of all CPUs that *other* processes used meanwhile (Linux): a figure taken on a busy
    machine is marked as such instead of passing for the code's speed."""


class RunProbe:
    """Peak memory a block adds above where it started (CUDA or Linux CPU), and the CPU others used."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.method = "cuda max_memory_allocated" if device.type == "cuda" else "VmHWM - VmRSS"
        self._libc = None
        if device.type != "cuda":
            with contextlib.suppress(OSError):
                self._libc = ctypes.CDLL("libc.so.6")
            if not _reset_peak_rss():
                self.method = "ru_maxrss delta (lower bound: peak RSS cannot be reset here)"

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measured]:
        out = Measured()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            cpu = _cpu_snapshot()
            yield out
            torch.cuda.synchronize(self.device)
            out.foreign_cpu_load = _foreign_load(cpu, _cpu_snapshot())
            out.peak_bytes = torch.cuda.max_memory_allocated(self.device) - before
            return
        if self._libc is not None:
            self._libc.malloc_trim(0)  # hand freed heap back, so reuse of old pages does not hide a peak
        reset = _reset_peak_rss()
        before = _proc_status_bytes("VmRSS") if reset else _ru_maxrss_bytes()
        cpu = _cpu_snapshot()
        yield out
        out.foreign_cpu_load = _foreign_load(cpu, _cpu_snapshot())
        after = _proc_status_bytes("VmHWM") if reset else _ru_maxrss_bytes()
        out.peak_bytes = max(0, after - before)


def _cpu_snapshot() -> tuple[float, int, int] | None:
    """(wall, busy ticks of the whole machine, ticks of this process and its children) from /proc.

    Children count as ours: (d)'s broker is a child process and its work is part of (d)'s cost.
    """
    try:
        with open("/proc/stat") as fh:
            ticks = [int(v) for v in fh.readline().split()[1:]]
        own = _process_ticks("self")
    except (OSError, ValueError, IndexError):
        return None
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != me:
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = _stat_fields(entry)
                if fields[1] == me:
                    own += int(fields[11]) + int(fields[12])
    return time.perf_counter(), sum(ticks) - ticks[3] - ticks[4], own


def _stat_fields(pid: str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, ... (utime and stime at 11 and 12)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def _process_ticks(pid: str) -> int:
    fields = _stat_fields(pid)
    return int(fields[11]) + int(fields[12])


def _foreign_load(start: tuple[float, int, int] | None, end: tuple[float, int, int] | None) -> float | None:
    """None for runs under a second: /proc counts in 10 ms ticks, too coarse to say anything."""
    if start is None or end is None or end[0] - start[0] < 1.0:
        return None
    others = (end[1] - start[1]) - (end[2] - start[2])
    return max(0.0, others / os.sysconf("SC_CLK_TCK") / ((end[0] - start[0]) * (os.cpu_count() or 1)))


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _proc_status_bytes(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _ru_maxrss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, shape: ModelShape, quick: bool) -> dict:
    """The best FLOP rate of a few matmuls: a square one and the model's own MLP shape.

    Best-of-many, not the mean: on a shared machine a disturbed repeat only ever reads slower, and a
    peak read too low would make every compute floor look better than it is.
    """
    gpu = device.type == "cuda"
    if quick:
        shapes, repeats = [(256, 256, 256)], 2
    else:
        n, rows = (8192, 16384) if gpu else (2048, 4096)
        shapes = [(n, n, n), (rows, shape.hidden_size, shape.intermediate_size)]
        repeats = 30 if gpu else 10
    best: dict = {"flops_per_s": 0.0}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        fastest_s = math.inf
        for i in range(repeats + 2):
            _sync(device)
            start = time.perf_counter()
            torch.mm(a, b)
            _sync(device)
            if i >= 2:
                fastest_s = min(fastest_s, time.perf_counter() - start)
        rate = 2 * m * k * n / fastest_s
        if rate > best["flops_per_s"]:
            best = {"shape": [m, k, n], "flops_per_s": rate}
    best["dtype"] = str(dtype).removeprefix("torch.")
    best["repeats"] = repeats
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------- contenders


class Contender:
    """A synchronous scorer driven by `drive`: jobs are submitted, `step` answers some of them."""

    def submit(self, index: int, job: Job) -> None:
        raise NotImplementedError

    def step(self) -> list[tuple[int, Scores | None, str | None]]:
        """Run one unit of work; (job index, scores or None, error or None) for each job it finished."""
        raise NotImplementedError

    forward_tokens = 0
    lm_head_rows = 0


class EngineContender(Contender):
    """`Scorer.prepare` on submission (as the worker does), then one `run_batch` per token budget."""

    def __init__(self, scorer, backend: str | None) -> None:
        from kafka_scorer.engine.scheduler import TokenBudgetScheduler

        self.scorer = scorer
        self.backend = backend
        self.scheduler = TokenBudgetScheduler(scorer.max_batch_tokens)
        self.index_of: dict[str, int] = {}
        self.ready: list[tuple[int, Scores | None, str | None]] = []
        self.causal = scorer.kind.value == "causal_lm"

    def submit(self, index: int, job: Job) -> None:
        job_id = f"{index}"
        self.index_of[job_id] = index
        prepared = self.scorer.prepare(job, job_id)
        if isinstance(prepared, Result):
            self.ready.append(self._answer(prepared))
        else:
            self.scheduler.add(prepared)

    def step(self) -> list[tuple[int, Scores | None, str | None]]:
        done, self.ready = self.ready, []
        batch = self.scheduler.next_batch()
        if not batch:
            return done
        previous = self.scorer.attention_backend
        if self.backend is not None:
            self.scorer.attention_backend = self.backend
        try:
            results = self.scorer.run_batch(batch)
        finally:
            self.scorer.attention_backend = previous
        for prepared, result in zip(batch, results):
            self.forward_tokens += result.prompt_tokens
            if self.causal and not prepared.job.apply_softmax:
                self.lm_head_rows += prepared.num_items
            done.append(self._answer(result))
        return done

    def _answer(self, result: Result) -> tuple[int, Scores | None, str | None]:
        error = None if result.error is None else f"{result.error.code.value}: {result.error.message}"
        return self.index_of[result.id], result.scores, error


class BaselineContender(Contender):
    """Takes queued jobs while their padded pairs fit one token budget, then scores them batch by batch."""

    def __init__(self, baseline: BaselineScorer, max_batch_tokens: int) -> None:
        self.baseline = baseline
        self.max_batch_tokens = max_batch_tokens
        self.queue: deque[tuple[int, Job]] = deque()

    def submit(self, index: int, job: Job) -> None:
        self.queue.append((index, job))

    def step(self) -> list[tuple[int, Scores | None, str | None]]:
        taken: list[tuple[int, Job]] = []
        tokens = 0
        while self.queue:
            _, job = self.queue[0]
            cost = len(job.items) * max((len(job.query) + len(i) for i in job.items), default=0)
            if taken and tokens + cost > self.max_batch_tokens:
                break
            taken.append(self.queue.popleft())
            tokens += cost
        jobs = [job for _, job in taken]
        scores: list[Scores] = [[[] for _ in job.items] for job in jobs]
        remaining = [len(job.items) for job in jobs]
        done: list[tuple[int, Scores | None, str | None]] = [
            (index, [], None) for (index, job) in taken if not job.items
        ]
        for rows in self.baseline.plan(jobs, self.max_batch_tokens):
            batch_scores, padded = self.baseline.score_rows(jobs, rows)
            self.forward_tokens += padded
            if self.baseline.causal:
                self.lm_head_rows += padded
            for (j, i), row in zip(rows, batch_scores):
                scores[j][i] = row
                remaining[j] -= 1
                if remaining[j] == 0:
                    done.append((taken[j][0], scores[j], None))
        return done


def fastest(records: Sequence[RunRecord]) -> RunRecord:
    best = min(records, key=lambda r: r.wall_s)
    best.runs = len(records)
    return best


def repeated(run: Callable[[int], RunRecord], repeats: int, budget_s: float) -> RunRecord:
    """Up to `repeats` runs while their total stays under `budget_s`; the fastest one."""
    records = [run(0)]
    while len(records) < repeats and sum(r.wall_s for r in records) < budget_s:
        records.append(run(len(records)))
    return fastest(records)


async def repeated_async(run, repeats: int, budget_s: float) -> RunRecord:
    records = [await run(0)]
    while len(records) < repeats and sum(r.wall_s for r in records) < budget_s:
        records.append(await run(len(records)))
    return fastest(records)


def drive(contender: Contender, jobs: Sequence[Job], window: int, probe: RunProbe) -> RunRecord:
    """The closed-loop client: `window` jobs outstanding, the next submitted as soon as one is answered."""
    n = len(jobs)
    scores: list[Scores | None] = [None] * n
    errors: list[str] = [""] * n
    submitted = [0.0] * n
    latencies = [0.0] * n
    with probe.measure() as peak:
        start = time.perf_counter()
        next_job = outstanding = 0

        def fill() -> None:
            nonlocal next_job, outstanding
            while outstanding < window and next_job < n:
                submitted[next_job] = time.perf_counter()
                contender.submit(next_job, jobs[next_job])
                next_job += 1
                outstanding += 1

        fill()
        while outstanding:
            finished = contender.step()
            now = time.perf_counter()
            if not finished:
                raise RuntimeError(f"{type(contender).__name__} made no progress with {outstanding} jobs out")
            for index, job_scores, error in finished:
                scores[index] = job_scores
                errors[index] = error or ""
                latencies[index] = now - submitted[index]
                outstanding -= 1
            fill()
        wall = time.perf_counter() - start
    return RunRecord(
        scores=scores,
        errors=errors,
        latencies=latencies,
        wall_s=wall,
        forward_tokens=contender.forward_tokens,
        lm_head_rows=contender.lm_head_rows,
        peak_bytes=peak.peak_bytes,
        foreign_cpu_load=peak.foreign_cpu_load,
    )


# --------------------------------------------------------------------------------------- (d) the worker


def run_worker_contender(
    scorer, jobs: Sequence[Job], window: int, probe: RunProbe, repeats: int = 1, budget_s: float = 0.0
) -> RunRecord:
    """(d): an embedded tansu broker, the real `Worker` in this process on the same `Scorer`, and a
    closed-loop aiokafka client with the same window as the in-process contenders."""
    import asyncio

    with _quiet_loggers("aiokafka", "kafka_scorer.worker"):
        return asyncio.run(_worker_run(scorer, list(jobs), window, probe, repeats, budget_s))


@contextlib.contextmanager
def _quiet_loggers(*names: str) -> Iterator[None]:
    """Expected warnings (tansu refusing the idempotent producer) would break up the table; errors stay."""
    import logging

    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


async def _worker_run(
    scorer, jobs: list[Job], window: int, probe: RunProbe, repeats: int, budget_s: float
) -> RunRecord:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from kafka_scorer.broker import EmbeddedBroker
    from kafka_scorer.config import Settings
    from kafka_scorer.worker.service import Worker

    requests, replies, partitions = "bench.requests", "bench.results", 4
    async with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, partitions, 1) for t in (requests, replies)])
        finally:
            await admin.close()
        settings = Settings(
            model=scorer.model_name,
            bootstrap_servers=bootstrap,
            request_topics=[requests],
            reply_topic=replies,
            group_id="kafka-scorer-bench",
            metrics_port=0,
            max_batch_tokens=scorer.max_batch_tokens,
            max_inflight_tokens=max(65536, 4 * scorer.max_batch_tokens),
            # The worker's default. tansu answers a waiting fetch only at its deadline (BROKERS.md), so a
            # short wait (the tests use 10 ms) turns both clients into busy pollers; on 2 cores that CPU
            # comes out of the forward pass (measured: many-items compute 3.6 s at 200 ms, 4.0 s at 10 ms).
            fetch_max_wait_ms=100,
            session_timeout_ms=3000,
            heartbeat_interval_ms=300,
            shutdown_grace_s=10.0,
            log_level="WARNING",
        )
        worker = Worker(settings, scorer)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=16 << 20)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            max_partition_fetch_bytes=16 << 20,
        )
        await producer.start()
        await consumer.start()
        try:
            deadline = time.monotonic() + 60
            while not (worker.ready and worker.consumer.assignment()):
                if task.done():
                    raise RuntimeError(f"the bench worker stopped at start (exit {task.result()})")
                if time.monotonic() > deadline:
                    raise RuntimeError("the bench worker did not join its consumer group in 60 s")
                await asyncio.sleep(0.05)
            reply_parts = [TopicPartition(replies, p) for p in range(partitions)]
            consumer.assign(reply_parts)
            await consumer.seek_to_end(*reply_parts)
            client = _KafkaClient(producer, consumer, requests)
            await client.run("warmup", warmup_jobs(jobs), window, None)
            return await repeated_async(
                lambda i: client.run(f"timed{i}", jobs, window, probe), repeats, budget_s
            )
        finally:
            await consumer.stop()
            await producer.stop()
            stop.set()
            await asyncio.wait_for(task, 60)


class _KafkaClient:
    """Closed loop over Kafka: `window` jobs outstanding, the next produced as each answer arrives."""

    def __init__(self, producer, consumer, topic: str) -> None:
        self.producer = producer
        self.consumer = consumer
        self.topic = topic

    async def run(self, tag: str, jobs: list[Job], window: int, probe: RunProbe | None) -> RunRecord:
        from kafka_scorer.protocol import CONTENT_TYPE_JSON, decode_result, encode_job

        n = len(jobs)
        scores: list[Scores | None] = [None] * n
        errors = [""] * n
        submitted = [0.0] * n
        latencies = [0.0] * n
        tokens = rows = 0
        sent = answered = 0
        with probe.measure() if probe is not None else contextlib.nullcontext(Measured()) as peak:
            start = time.perf_counter()

            async def fill() -> None:
                nonlocal sent
                while sent - answered < window and sent < n:
                    job = jobs[sent]
                    wire = Job(
                        id=f"{tag}-{sent}",
                        query=job.query,
                        items=job.items,
                        label_token_ids=job.label_token_ids,
                        apply_softmax=job.apply_softmax,
                        multi_item=job.multi_item,
                    )
                    submitted[sent] = time.perf_counter()
                    await self.producer.send(
                        self.topic, encode_job(wire), headers=[("content-type", CONTENT_TYPE_JSON.encode())]
                    )
                    sent += 1

            await fill()
            deadline = time.monotonic() + 600
            while answered < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker answered {answered} of {n} jobs in 600 s")
                batch = await self.consumer.getmany(timeout_ms=100)
                now = time.perf_counter()
                for records in batch.values():
                    for record in records:
                        result = decode_result(record.value)
                        prefix, _, index_text = result.id.rpartition("-")
                        if prefix != tag:
                            continue
                        index = int(index_text)
                        if scores[index] is not None or errors[index]:
                            continue  # a redelivered duplicate (at-least-once)
                        scores[index] = result.scores
                        if result.error is not None:
                            errors[index] = f"{result.error.code.value}: {result.error.message}"
                        latencies[index] = now - submitted[index]
                        tokens += result.prompt_tokens
                        if result.scores and jobs[index].label_token_ids and not jobs[index].apply_softmax:
                            rows += len(jobs[index].items)
                        answered += 1
                await fill()
            wall = time.perf_counter() - start
        return RunRecord(
            scores=scores,
            errors=errors,
            latencies=latencies,
            wall_s=wall,
            forward_tokens=tokens,
            lm_head_rows=rows,
            peak_bytes=peak.peak_bytes,
            foreign_cpu_load=peak.foreign_cpu_load,
        )


# --------------------------------------------------------------------------------------- reporting


@dataclass
class ContenderSummary:
    label: str
    jobs: int
    items: int
    errors: int
    wall_s: float
    items_per_s: float
    tokens_per_s: float
    """Tokens the contender itself ran through the model, per second."""
    pair_tokens_per_s: float
    """Tokens of the `query + item` pairs scored, per second: the same numerator for every contender."""
    forward_tokens: int
    latency_p50_s: float
    latency_p99_s: float
    peak_memory_bytes: int
    floor_s: float
    floor_fraction: float
    foreign_cpu_load: float | None = None
    runs: int = 1
    """Timed runs made; the figures are those of the fastest (the one least disturbed)."""
    max_abs_diff_vs_baseline: float | None = None
    first_error: str | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: with few jobs p99 is simply the slowest)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarise(
    label: str, record: RunRecord, workload: Workload, shape: ModelShape, peak_flops: float
) -> ContenderSummary:
    wall = max(record.wall_s, 1e-9)
    flops = 2 * shape.decoder_params() * record.forward_tokens
    flops += 2 * shape.lm_head_params() * record.lm_head_rows
    floor = flops / peak_flops
    errors = [e for e in record.errors if e]
    return ContenderSummary(
        label=label,
        jobs=len(workload.jobs),
        items=workload.num_items,
        errors=len(errors),
        wall_s=record.wall_s,
        items_per_s=workload.num_items / wall,
        tokens_per_s=record.forward_tokens / wall,
        pair_tokens_per_s=workload.pair_tokens / wall,
        forward_tokens=record.forward_tokens,
        latency_p50_s=percentile(record.latencies, 50),
        latency_p99_s=percentile(record.latencies, 99),
        peak_memory_bytes=record.peak_bytes,
        floor_s=floor,
        floor_fraction=floor / wall,
        foreign_cpu_load=record.foreign_cpu_load,
        runs=record.runs,
        first_error=errors[0] if errors else None,
    )


def max_abs_diff(got: Sequence[Scores | None], want: Sequence[Scores | None]) -> float:
    """Largest |difference| over all score cells; inf when a job is missing or shaped differently."""
    worst = 0.0
    for g, w in zip(got, want):
        if g is None or w is None or len(g) != len(w):
            return math.inf
        for row_g, row_w in zip(g, w):
            if len(row_g) != len(row_w):
                return math.inf
            for a, b in zip(row_g, row_w):
                worst = max(worst, abs(a - b))
    return worst


def tolerance(dtype: torch.dtype) -> float:
    """Scores are probabilities (or small logits): float32 differs only by summation order."""
    return 2e-3 if dtype == torch.float32 else 6e-2


# --------------------------------------------------------------------------------------- the run


def default_backends(device: torch.device) -> tuple[str, ...]:
    """FlexAttention compiles on CUDA only; on CPU it would run its eager reference (not a contender)."""
    from kafka_scorer.engine.attention import BACKENDS

    wanted = ("dense", "cascade", "flex") if device.type == "cuda" else ("dense", "cascade")
    return tuple(b for b in wanted if b in BACKENDS)


def warmup_jobs(jobs: Sequence[Job], count: int = 2, max_items: int = 4) -> list[Job]:
    """A small slice of the workload with the same structure: first calls pay their one-off costs here."""
    out = []
    for job in list(jobs)[:count]:
        out.append(
            Job(
                id=f"warmup-{job.id}",
                query=job.query,
                items=job.items[:max_items],
                label_token_ids=job.label_token_ids,
                apply_softmax=job.apply_softmax,
                multi_item=job.multi_item,
            )
        )
    return out


def window_for(workload: Workload, max_batch_tokens: int) -> int:
    """Jobs outstanding: enough MIS-packed jobs to fill two token budgets (at least 2)."""
    per_job = workload.packed_tokens / max(1, len(workload.jobs))
    return max(2, math.ceil(2 * max_batch_tokens / max(per_job, 1)))


@dataclass
class Environment:
    device: torch.device
    dtype: torch.dtype
    shape: ModelShape
    model_root: Path
    peak: dict
    probe: RunProbe
    scorers: dict[str, object] = field(default_factory=dict)
    baselines: dict[str, BaselineScorer] = field(default_factory=dict)

    def checkpoint(self, kind: str) -> Path:
        dtype = str(self.dtype).removeprefix("torch.")
        path = self.model_root / f"{self.shape.name}-{kind}-{dtype}"
        if not (path / "config.json").exists():
            init_device = "cuda" if self.device.type == "cuda" else "cpu"
            build_shaped_model(path, self.shape, kind, dtype=dtype, init_device=init_device)  # type: ignore[arg-type]
        return path

    def scorer(self, kind: str, max_batch_tokens: int):
        from kafka_scorer.engine.scorer import Scorer

        if kind not in self.scorers:
            self.scorers[kind] = Scorer(
                str(self.checkpoint(kind)),
                served_model_name=f"bench-{self.shape.name}-{kind}",
                dtype=str(self.dtype).removeprefix("torch."),
                device=str(self.device),
                max_batch_tokens=max_batch_tokens,
            )
        return self.scorers[kind]

    def baseline(self, kind: str) -> BaselineScorer:
        if kind not in self.baselines:
            self.baselines[kind] = BaselineScorer(
                str(self.checkpoint(kind)), dtype=self.dtype, device=self.device
            )
        return self.baselines[kind]


def run_workload(
    env: Environment, workload: Workload, config: BenchConfig, backends: Sequence[str], log: Callable
) -> dict:
    kind = workload.spec.model_kind
    scorer = env.scorer(kind, config.max_batch_tokens)
    baseline = env.baseline(kind)
    window = window_for(workload, config.max_batch_tokens)
    no_mis = with_multi_item(workload.jobs, False)
    mis = with_multi_item(workload.jobs, True)
    peak_flops = env.peak["flops_per_s"]

    def timed(make: Callable[[], Contender], jobs: list[Job]) -> RunRecord:
        drive(make(), warmup_jobs(jobs), window, env.probe)
        return repeated(
            lambda _: drive(make(), jobs, window, env.probe), config.repeats, config.repeat_budget_s
        )

    runs: dict[str, tuple[str, RunRecord]] = {}
    default_backend = scorer.attention_backend
    log("  (c) baseline ...")
    runs["c"] = (
        "transformers baseline",
        timed(lambda: BaselineContender(baseline, config.max_batch_tokens), no_mis),
    )
    log(f"  (a) engine, MIS off [{default_backend}] ...")
    runs["a"] = (
        f"engine, MIS off [{default_backend}]",
        timed(lambda: EngineContender(scorer, None), no_mis),
    )
    for backend in backends:
        log(f"  (b) engine, MIS on [{backend}] ...")
        runs[f"b:{backend}"] = (
            f"engine, MIS on [{backend}]",
            timed(lambda backend=backend: EngineContender(scorer, backend), mis),
        )
    if not config.skip_worker:
        log(f"  (d) worker through the broker [{default_backend}] ...")
        runs["d"] = (
            f"worker via broker [{default_backend}]",
            run_worker_contender(scorer, mis, window, env.probe, config.repeats, config.repeat_budget_s),
        )

    reference = runs["c"][1].scores
    contenders = {}
    for key, (label, record) in runs.items():
        summary = summarise(label, record, workload, env.shape, peak_flops)
        if key != "c":
            summary.max_abs_diff_vs_baseline = max_abs_diff(record.scores, reference)
        contenders[key] = asdict(summary)

    def ratio(top: str, bottom: str) -> float | None:
        if top not in contenders or bottom not in contenders:
            return None
        return contenders[top]["items_per_s"] / max(contenders[bottom]["items_per_s"], 1e-12)

    token_ratio = runs["a"][1].forward_tokens / max(
        1, min(runs[f"b:{b}"][1].forward_tokens for b in backends)
    )
    ratios = {
        "token_ratio_a_over_b": token_ratio,
        "b_over_a": {b: ratio(f"b:{b}", "a") for b in backends},
        "b_over_c": {b: ratio(f"b:{b}", "c") for b in backends},
        "a_over_c": ratio("a", "c"),
    }
    default_key = f"b:{default_backend}" if f"b:{default_backend}" in contenders else f"b:{backends[0]}"
    ratios["b_over_a_vs_token_ratio"] = {b: (ratios["b_over_a"][b] or 0.0) / token_ratio for b in backends}
    if "d" in contenders:
        ratios["d_over_b"] = ratio("d", default_key)
    diffs = [
        c["max_abs_diff_vs_baseline"]
        for c in contenders.values()
        if c["max_abs_diff_vs_baseline"] is not None
    ]
    errors = sum(c["errors"] for c in contenders.values())
    tol = tolerance(env.dtype)
    return {
        "spec": asdict(workload.spec),
        "jobs": len(workload.jobs),
        "items": workload.num_items,
        "pair_tokens": workload.pair_tokens,
        "packed_tokens": workload.packed_tokens,
        "window": window,
        "contenders": contenders,
        "ratios": ratios,
        "cross_check": {
            "max_abs_diff": max(diffs, default=0.0),
            "tolerance": tol,
            "errors": errors,
            "ok": errors == 0 and max(diffs, default=0.0) <= tol,
        },
    }


def run_bench(config: BenchConfig) -> dict:
    """Everything in one process: build/load models, measure the matmul peak, run every workload."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-checkpoint bars would bury the benchmark's own lines
    log = print if config.verbose else (lambda *a, **k: None)
    from kafka_scorer.engine.model import resolve_device, resolve_dtype

    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    shape_name = config.model_shape or (
        "tiny" if config.quick else ("qwen3-0.6b" if device.type == "cuda" else "cpu-small")
    )
    shape = SHAPES[shape_name]
    backends = config.backends or default_backends(device)
    started = time.time()
    with contextlib.ExitStack() as stack:
        if config.model_dir:
            root = Path(config.model_dir)
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kafka-scorer-bench-")))
        log(f"measuring the {dtype} matmul peak on {device} ...")
        env = Environment(
            device=device,
            dtype=dtype,
            shape=shape,
            model_root=root,
            peak=measure_matmul_peak(device, dtype, shape, config.quick),
            probe=RunProbe(device),
        )
        log(f"  {env.peak['flops_per_s'] / 1e9:.1f} GFLOP/s")
        results = {}
        for name in config.workloads:
            spec = workload_spec(name, quick=config.quick, device_type=device.type, num_jobs=config.num_jobs)
            workload = build_workload(spec, shape.vocab_size, seed=config.seed)
            log(f"workload {name}: {len(workload.jobs)} jobs, {workload.num_items} items")
            results[name] = run_workload(env, workload, config, backends, log)
        label_kernel = None
        if not config.skip_label_kernel:
            label_kernel = _label_kernel(device, config.quick, log)
        default_backend = env.scorers[next(iter(env.scorers))].attention_backend if env.scorers else None
    if default_backend not in backends:  # targets are judged on a backend that was measured
        default_backend = backends[0] if backends else None
    return {
        "meta": _meta(device, dtype, shape, backends, config, started),
        "matmul_peak": env.peak,
        "memory_method": env.probe.method,
        "workloads": results,
        "label_kernel": label_kernel,
        "targets": evaluate_targets(results, label_kernel, device, default_backend),
        "ok": all(w["cross_check"]["ok"] for w in results.values()),
    }


def evaluate_targets(
    results: dict, label_kernel: dict | None, device: torch.device, backend: str | None
) -> list[dict]:
    """The issue's targets, each as measured / goal, for the backend the worker would use."""
    gpu = device.type == "cuda"
    targets: list[dict] = []

    def add(name: str, value: float | None, goal: float, note: str = "") -> None:
        met = None if value is None else value >= goal
        targets.append({"target": name, "value": value, "goal": goal, "met": met, "note": note})

    for name in ("rerank", "many-items"):
        if name in results and backend is not None:
            value = results[name]["ratios"]["b_over_a_vs_token_ratio"].get(backend)
            add(f"{name}: (b)/(a) as a share of the token ratio [{backend}]", value, 0.9)
    if "rerank" in results and backend is not None:
        add(
            f"rerank: (b)/(c) items/s [{backend}]",
            results["rerank"]["ratios"]["b_over_c"].get(backend),
            6.0 if gpu else 8.0,
        )
    for name, w in results.items():
        if w["ratios"].get("d_over_b") is not None:
            add(f"{name}: (d)/(b) items/s", w["ratios"]["d_over_b"], 0.9)
    if label_kernel:
        shape = label_kernel["shape"]
        note = f"rows={shape['rows']} vocab={shape['vocab']}" + (
            ""
            if (shape["rows"], shape["vocab"]) == (4096, 151_936)
            else " (the issue's shape is 4096 x 151936)"
        )
        add(
            "label kernel: logprobs speed-up vs log_softmax + gather",
            label_kernel["speedup_vs_baseline"].get("logprobs"),
            5.0,
            note,
        )
    if gpu and "many-items" in results and backend is not None:
        floor = results["many-items"]["contenders"].get(f"b:{backend}", {}).get("floor_fraction")
        add(f"many-items: (b) forward as a fraction of the matmul peak [{backend}]", floor, 0.5)
    return targets


def _label_kernel(device: torch.device, quick: bool, log: Callable) -> dict | None:
    try:
        from kafka_scorer.bench.label_kernel import run_label_kernel_bench
    except ImportError:
        return None
    log("label kernel micro-benchmark ...")
    if quick:
        return run_label_kernel_bench(device, rows=32, vocab=2048, hidden=64, repeats=1, verbose=False)
    return run_label_kernel_bench(device, verbose=False)


def _meta(
    device: torch.device,
    dtype: torch.dtype,
    shape: ModelShape,
    backends: Sequence[str],
    config: BenchConfig,
    started: float,
) -> dict:
    import transformers

    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = _cpu_model()
    return {
        "device": str(device),
        "device_name": device_name,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."),
        "model_shape": asdict(shape),
        "decoder_params": shape.decoder_params(),
        "lm_head_params": shape.lm_head_params(),
        "backends": list(backends),
        "max_batch_tokens": config.max_batch_tokens,
        "repeats": config.repeats,
        "repeat_budget_s": config.repeat_budget_s,
        "quick": config.quick,
        "seed": config.seed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started,
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"
